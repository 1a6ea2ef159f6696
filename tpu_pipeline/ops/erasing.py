"""`random_erasing`: Random Erasing (Zhong et al., arXiv 1708.04896) as timm and the DeiT recipe use it.

With `probability`, `count` rectangles (min_count..max_count) are erased, each of an area drawn
uniformly in [min_area, max_area] of the image and of an aspect ratio log-uniform in
[min_aspect, max_aspect]; of `trials` such draws the first that fits is taken (none fits: nothing is
erased). It lies wholly inside the image, at a uniformly drawn corner, as timm places it.
(tensorflow/models draws the *center* in [0, H - h), so its rectangles are cut at the top and left
borders and never reach the bottom and right ones; docs/images.md.) The rectangle is filled with
Gaussian noise per pixel (`fill: noise`, timm's "pixel" mode: the op goes after `normalize`) or a
constant.

All trials are drawn at once, the noise is drawn for the rectangle alone and the image is put back
together around it, so an erased image costs about one copy of it; the image leaves the op with its
static shape.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops._util import one_line
from tpu_pipeline.ops.keyed import keyed
from tpu_pipeline.ops.registry import register_op


def erased_box(seed: tf.Tensor, height: int, width: int, min_area: float, max_area: float,
               min_log_aspect: float, max_log_aspect: float, trials: int) -> tuple[tf.Tensor, tf.Tensor]:
    """(top, bottom, left, right) of the rectangle, and whether any of the `trials` draws fit."""
    draws = tf.random.stateless_uniform([4, trials], seed=seed)
    area = height * width * (min_area + (max_area - min_area) * draws[0])
    aspect = tf.exp(min_log_aspect + (max_log_aspect - min_log_aspect) * draws[1])
    box_height = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
    box_width = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
    fits = (box_height < height) & (box_width < width) & (box_height > 0) & (box_width > 0)
    first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)  # the first that fits (0 if none)
    box_height, box_width = box_height[first], box_width[first]
    top = tf.cast(draws[2, first] * tf.cast(height - box_height + 1, tf.float32), tf.int32)
    left = tf.cast(draws[3, first] * tf.cast(width - box_width + 1, tf.float32), tf.int32)
    top, left = tf.minimum(top, height - box_height), tf.minimum(left, width - box_width)
    return tf.stack([top, top + box_height, left, left + box_width]), tf.reduce_any(fits)


@register_op("random_erasing", random=True)
@keyed(default_key="image")
def random_erasing(probability: float = 0.25, min_area: float = 0.02, max_area: float = 1 / 3,
                   min_aspect: float = 0.3, max_aspect: Optional[float] = None, min_count: int = 1,
                   max_count: int = 1, trials: int = 10, fill: Union[str, float] = "noise"):
    """Erases, with `probability`, min_count..max_count rectangles of min_area..max_area of the image
    (aspect min_aspect..max_aspect, default 1/min_aspect) filled with N(0, 1) noise ('noise') or a number."""
    max_aspect = 1 / min_aspect if max_aspect is None and min_aspect > 0 else max_aspect
    if not 0 <= probability <= 1:
        raise ConfigError(f"op 'random_erasing': probability must be within 0..1, got {probability!r}")
    if not 0 < min_area <= max_area < 1:
        raise ConfigError(f"op 'random_erasing': needs 0 < min_area <= max_area < 1, got {min_area!r}, {max_area!r}")
    if not (min_aspect > 0 and max_aspect is not None and max_aspect >= min_aspect):
        raise ConfigError(f"op 'random_erasing': needs 0 < min_aspect <= max_aspect, got {min_aspect!r}, {max_aspect!r}")
    if not (isinstance(min_count, int) and isinstance(max_count, int) and 1 <= min_count <= max_count):
        raise ConfigError(f"op 'random_erasing': needs ints 1 <= min_count <= max_count, got {min_count!r}, {max_count!r}")
    if not isinstance(trials, int) or trials < 1:
        raise ConfigError(f"op 'random_erasing': trials must be a positive int, got {trials!r}")
    if not (fill == "noise" or (isinstance(fill, (int, float)) and not isinstance(fill, bool))):
        raise ConfigError(f"op 'random_erasing': fill must be 'noise' or a number, got {fill!r}")
    log_aspects = (math.log(min_aspect), math.log(max_aspect))

    def erase(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        height, width = image.shape[0], image.shape[1]
        count_draw = tf.random.stateless_uniform([], seed=tf.random.experimental.stateless_fold_in(seed, 0))
        count = min_count + tf.cast(count_draw * (max_count - min_count + 1), tf.int32)
        for index in range(max_count):
            box, fits = erased_box(tf.random.experimental.stateless_fold_in(seed, index + 1), height, width,
                                   min_area, max_area, *log_aspects, trials)
            image = tf.cond(fits & (index < count),
                            lambda box=box, index=index: filled(image, box, tf.random.experimental.stateless_fold_in(
                                seed, -1 - index)),
                            lambda: tf.identity(image))
        return image

    def filled(image: tf.Tensor, box: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """The image with the box's pixels replaced: noise is drawn for the box alone (on the host a map may
        make shapes that vary; the image it returns has its static shape again)."""
        top, bottom, left, right = tf.unstack(box)
        shape = tf.stack([bottom - top, right - left, image.shape[-1]])
        if fill == "noise":
            patch = tf.cast(tf.random.stateless_normal(shape, seed=seed), image.dtype)
        else:
            patch = tf.fill(shape, tf.cast(fill, image.dtype))
        band = tf.concat([image[top:bottom, :left], patch, image[top:bottom, right:]], axis=1)
        return tf.ensure_shape(tf.concat([image[:top], band, image[bottom:]], axis=0), image.shape)

    def fn(image: tf.Tensor, seed: Optional[tf.Tensor] = None) -> tf.Tensor:
        if image.shape.rank != 3 or not image.shape.is_fully_defined():
            raise one_line(f"op 'random_erasing': needs one image of a static shape [height, width, channels], got "
                           f"{image.shape}; put it after an op that makes a fixed size")
        if fill == "noise" and not image.dtype.is_floating:
            raise one_line(f"op 'random_erasing': fill 'noise' draws N(0, 1) values, which a {image.dtype.name} image "
                           f"cannot hold; put the op after 'normalize' (as DeiT does), or set fill to a number")
        applies = tf.random.stateless_uniform([], seed=seed) < probability
        return tf.cond(applies, lambda: erase(image, tf.random.experimental.stateless_fold_in(seed, 1)),
                       lambda: tf.identity(image))

    return fn

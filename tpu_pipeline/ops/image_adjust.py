"""The image transforms RandAugment chooses from, on one uint8 image [H, W, 3], each a pure function.

They compute what tensorflow/models' `official/vision/ops/augment.py` computes (the op set and the
arithmetic TPU users train with; `tests/test_randaugment.py` compares each with TFM's own, loaded as a
package), written for the host CPU of a TPU VM:

- every channel at once (one histogram of 768 bins for Equalize, one min/max for AutoContrast), where TFM
  runs each channel alone and stacks them;
- a geometric op is one projective transform. TFM adds a fourth channel of ones before it and, after
  it, fills the pixels where that channel is 0 with gray. With its fill mode (reflect) no output pixel
  falls outside the image, so that channel is 1 everywhere and the fill never happens: the output is
  the transform's alone, and so is ours. Shifts and shears are index gathers that compute the
  transform's own coordinates, reflection and rounding (`reflected`): the same pixels, ~2.5x less CPU.
- Cutout takes its corner from the op's stateless seed (TFM draws from TF's global random state).

Every shape stays static, as a TPU needs.
"""
from __future__ import annotations

import math

import tensorflow as tf

GRAY = 128  # what Cutout fills with (TFM's `replace` value)


def blend(image1: tf.Tensor, image2: tf.Tensor, factor: tf.Tensor | float) -> tf.Tensor:
    """image1 + factor * (image2 - image1) in float32, clipped to 0..255 and truncated to uint8 (PIL's
    ImageEnhance: factor 0 gives image1, 1 gives image2, above 1 extrapolates)."""
    first = tf.cast(image1, tf.float32)
    mixed = first + tf.cast(factor, tf.float32) * (tf.cast(image2, tf.float32) - first)
    return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def autocontrast(image: tf.Tensor) -> tf.Tensor:
    """Each channel stretched so its lowest value becomes 0 and its highest 255 (a flat channel stays)."""
    low = tf.cast(tf.reduce_min(image, axis=[0, 1]), tf.float32)
    high = tf.cast(tf.reduce_max(image, axis=[0, 1]), tf.float32)
    scale = tf.where(high > low, 255.0 / tf.maximum(high - low, 1.0), 1.0)
    offset = tf.where(high > low, -low * scale, 0.0)
    return tf.cast(tf.clip_by_value(tf.cast(image, tf.float32) * scale + offset, 0.0, 255.0), tf.uint8)


def equalize(image: tf.Tensor) -> tf.Tensor:
    """PIL's ImageOps.equalize per channel: each value mapped through its channel's cumulative histogram."""
    channels = image.shape[-1]
    values = tf.cast(image, tf.int32) + 256 * tf.range(channels)  # channel c's values in bins 256c..256c+255
    histogram = tf.reshape(tf.math.bincount(tf.reshape(values, [-1]), minlength=256 * channels,
                                            maxlength=256 * channels), [channels, 256])
    brightest = tf.gather(histogram, tf.cast(tf.reduce_max(image, axis=[0, 1]), tf.int32), batch_dims=1)
    step = (tf.reduce_sum(histogram, axis=1) - brightest) // 255  # PIL leaves out the last non-empty bin
    safe_step = tf.maximum(step, 1)[:, None]
    table = (tf.cumsum(histogram, axis=1) + safe_step // 2) // safe_step
    table = tf.clip_by_value(tf.concat([tf.zeros([channels, 1], tf.int32), table[:, :-1]], axis=1), 0, 255)
    table = tf.where(step[:, None] > 0, table, tf.range(256)[None, :])  # a one-valued channel stays
    return tf.cast(tf.gather(tf.reshape(table, [-1]), values), tf.uint8)


def invert(image: tf.Tensor) -> tf.Tensor:
    return 255 - image


def posterize(image: tf.Tensor, bits: int) -> tf.Tensor:
    """Keeps the `bits` highest bits of every value."""
    shift = 8 - bits
    return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def solarize(image: tf.Tensor, threshold: tf.Tensor | int) -> tf.Tensor:
    """Values at or above `threshold` inverted. In uint8 arithmetic, not `tf.where` (a select costs ~3x as
    much on the host): image + above * (255 - 2 image), which wraps to 255 - image where above is 1."""
    above = tf.cast(tf.cast(image, tf.int32) >= tf.cast(threshold, tf.int32), image.dtype)
    return image + above * (255 - image - image)


def solarize_add(image: tf.Tensor, addition: tf.Tensor | int, threshold: int = 128) -> tf.Tensor:
    """`addition` (0..255) added, saturating at 255, to the values below `threshold`: in uint8 arithmetic."""
    addition = tf.cast(addition, image.dtype)
    below = tf.cast(image < threshold, image.dtype)
    return image + below * (tf.minimum(image, 255 - addition) + addition - image)


def grayscale(image: tf.Tensor) -> tf.Tensor:
    return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def color(image: tf.Tensor, factor: tf.Tensor | float) -> tf.Tensor:
    """PIL's Color: the image blended with its gray version."""
    return blend(grayscale(image), image, factor)


def contrast(image: tf.Tensor, factor: tf.Tensor | float) -> tf.Tensor:
    """TF's adjust_contrast: each channel's values moved from or toward the channel's mean."""
    return tf.image.adjust_contrast(image, factor)


def brightness(image: tf.Tensor, factor: tf.Tensor | float) -> tf.Tensor:
    """PIL's Brightness: the image blended with black."""
    return blend(tf.zeros_like(image), image, factor)


def sharpness(image: tf.Tensor, factor: tf.Tensor | float) -> tf.Tensor:
    """PIL's Sharpness: the image blended with its SMOOTH-filtered version (the border pixels kept)."""
    kernel = tf.tile(tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32, shape=[3, 3, 1, 1]) / 13.0,
                     [1, 1, image.shape[-1], 1])
    smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel, [1, 1, 1, 1], padding="VALID")
    smooth = tf.cast(tf.clip_by_value(smooth[0], 0.0, 255.0), tf.uint8)
    inner = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
    degenerate = tf.where(inner, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
    return blend(degenerate, image, factor)


def projective(image: tf.Tensor, transform: tf.Tensor) -> tf.Tensor:
    """The image resampled by an 8-parameter projective `transform` (output point → input point),
    nearest pixel, points outside reflected (TFM's choices)."""
    output = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=tf.reshape(tf.cast(transform, tf.float32), [1, 8]),
        output_shape=tf.shape(image)[:2], fill_value=0.0, fill_mode="REFLECT", interpolation="NEAREST")
    return tf.ensure_shape(output[0], image.shape)


def rotation(degrees: tf.Tensor | float, height: int, width: int) -> tf.Tensor:
    """The transform of a rotation by `degrees` about the image's center."""
    radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
    cos, sin = tf.cos(radians), tf.sin(radians)
    x_offset = ((width - 1) - (cos * (width - 1) - sin * (height - 1))) / 2.0
    y_offset = ((height - 1) - (sin * (width - 1) + cos * (height - 1))) / 2.0
    return tf.stack([cos, -sin, x_offset, sin, cos, y_offset, 0.0, 0.0])


def reflected(coordinates: tf.Tensor, length: int) -> tf.Tensor:
    """Float coordinates outside 0..length-1 reflected back into it ([abcd] -> dcba|abcd|dcba), then clamped:
    what ImageProjectiveTransformV3's REFLECT fill does to each coordinate before it rounds it."""
    size2 = 2.0 * length
    inside_negative = coordinates + size2 * tf.floor(-coordinates / size2)  # C++ truncates -c / size2 (> 0)
    negative = tf.where(coordinates < size2, inside_negative, coordinates)
    negative = tf.where(negative < -length, negative + size2, -negative - 1.0)
    positive = coordinates - size2 * tf.floor(coordinates / size2)
    positive = tf.where(positive >= length, size2 - positive - 1.0, positive)
    mapped = tf.where(coordinates < 0, negative, tf.where(coordinates > length - 1, positive, coordinates))
    return tf.clip_by_value(mapped, 0.0, length - 1.0)


def _nearest(coordinates: tf.Tensor, length: int) -> tf.Tensor:
    """The pixel index a reflected coordinate rounds to (std::round: halves away from zero; all are >= 0)."""
    return tf.cast(tf.floor(reflected(coordinates, length) + 0.5), tf.int32)


def shifted(image: tf.Tensor, pixels: tf.Tensor | float, horizontal: bool) -> tf.Tensor:
    """The image shifted by `pixels` to the left (horizontal) or up (negative: right or down), the edge
    reflected: `projective` of a translation, as two index gathers (~2.5x less CPU on 224 x 224)."""
    axis = 1 if horizontal else 0
    length = image.shape[axis]
    return tf.gather(image, _nearest(tf.range(length, dtype=tf.float32) + tf.cast(pixels, tf.float32), length),
                     axis=axis)


def sheared(image: tf.Tensor, level: tf.Tensor | float, horizontal: bool) -> tf.Tensor:
    """The image sheared by `level` along x (horizontal: x' = x + level y) or y (y' = y + level x), the edge
    reflected: `projective` of a shear, as one gather per row (or column)."""
    level = tf.cast(level, tf.float32)
    if not horizontal:
        return tf.transpose(sheared(tf.transpose(image, [1, 0, 2]), level, True), [1, 0, 2])
    height, width = image.shape[0], image.shape[1]
    columns = tf.range(width, dtype=tf.float32)[None, :] + level * tf.range(height, dtype=tf.float32)[:, None]
    return tf.gather(image, _nearest(columns, width), axis=1, batch_dims=1)


def box_mask(height: int, width: int, top: tf.Tensor, bottom: tf.Tensor, left: tf.Tensor,
             right: tf.Tensor) -> tf.Tensor:
    """bool [..., height, width, 1]: True on rows top..bottom-1 and columns left..right-1. The bounds may
    have leading batch dimensions; the mask broadcasts over channels."""
    rows = tf.range(height)[:, None]
    columns = tf.range(width)[None, :]
    expand = lambda bound: tf.cast(bound, tf.int32)[..., None, None]  # noqa: E731
    inside = ((rows >= expand(top)) & (rows < expand(bottom))) & ((columns >= expand(left)) & (columns < expand(right)))
    return inside[..., None]


def cutout(image: tf.Tensor, half_size: tf.Tensor | int, center_y: tf.Tensor, center_x: tf.Tensor,
           fill: int = GRAY) -> tf.Tensor:
    """A square of side 2 * half_size, centered at (center_y, center_x) and cut at the borders, set to `fill`."""
    height, width = image.shape[0], image.shape[1]
    mask = box_mask(height, width, tf.maximum(center_y - half_size, 0), tf.minimum(center_y + half_size, height),
                    tf.maximum(center_x - half_size, 0), tf.minimum(center_x + half_size, width))
    return tf.where(mask, tf.constant(fill, image.dtype), image)

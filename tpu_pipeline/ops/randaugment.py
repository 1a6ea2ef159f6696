"""`randaugment`: RandAugment (Cubuk et al., arXiv 1909.13719) with tensorflow/models' op set and magnitude scale.

Per layer, one of the ops or none is chosen uniformly (TFM draws from len(ops) + 1 choices, the last
being no change; so does this), and applied at the magnitude (0..10 on TFM's scale; 9 or 10 in the
DeiT and ResNet-RS recipes). The magnitude sets each op's argument as TFM's `level_to_arg` does:
rotations up to 30 degrees, shears up to 0.3, shifts up to `translate_const` pixels (each to either
side, with equal chance), enhancement factors 0.1..1.9, Posterize to int(4 m/10) bits, Solarize above
int(256 m/10), SolarizeAdd +int(110 m/10), Cutout squares of side 2 int(cutout_const m/10) in gray.

Every random choice (op, side, Cutout's place, the magnitude's noise with `magnitude_std`, whether a
layer applies with `prob_to_apply`) comes from the op's stateless seed, so the same config gives the
same images and an exact resume gives the images an uninterrupted run would have. Images of any dtype
are taken: like TFM, they are clipped to 0..255, cast to uint8 for the ops and cast back after.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import image_adjust as adjust
from tpu_pipeline.ops._util import one_line
from tpu_pipeline.ops.keyed import keyed
from tpu_pipeline.ops.registry import register_op

MAX_LEVEL = 10.0

# TFM's RandAugment.available_ops, in its order (the order sets which op a draw chooses).
OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "Color", "Contrast", "Brightness",
       "Sharpness", "ShearX", "ShearY", "TranslateX", "TranslateY", "Cutout", "SolarizeAdd")
SIGNED = frozenset({"Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"})  # each side with equal chance

# What one layer draws from its seed, in one call: the op, its side, Cutout's center (y, x), whether it applies.
_CHOICE, _SIDE, _CENTER_Y, _CENTER_X, _APPLY = range(5)


def op_argument(name: str, level: tf.Tensor | float, cutout_const: float = 40.0,
                translate_const: float = 100.0) -> Optional[tf.Tensor | float]:
    """The argument op `name` takes at magnitude `level` before its side is chosen (TFM's `level_to_arg`);
    None for the ops that take none. Integer arguments are truncated, as TFM's int() does."""
    fraction = level / MAX_LEVEL
    whole = (lambda value: tf.cast(value, tf.int32)) if isinstance(level, tf.Tensor) else int
    arguments = {
        "Rotate": lambda: fraction * 30.0,
        "Posterize": lambda: whole(fraction * 4),
        "Solarize": lambda: whole(fraction * 256),
        "SolarizeAdd": lambda: whole(fraction * 110),
        "Color": lambda: fraction * 1.8 + 0.1,
        "Contrast": lambda: fraction * 1.8 + 0.1,
        "Brightness": lambda: fraction * 1.8 + 0.1,
        "Sharpness": lambda: fraction * 1.8 + 0.1,
        "ShearX": lambda: fraction * 0.3,
        "ShearY": lambda: fraction * 0.3,
        "TranslateX": lambda: fraction * float(translate_const),
        "TranslateY": lambda: fraction * float(translate_const),
        "Cutout": lambda: whole(fraction * cutout_const),
    }
    return arguments[name]() if name in arguments else None


def apply_op(name: str, image: tf.Tensor, argument, center_y: tf.Tensor | int = 0,
             center_x: tf.Tensor | int = 0) -> tf.Tensor:
    """Op `name` on a uint8 image [H, W, C] with its (signed) argument; Cutout's square at (center_y, center_x)."""
    height, width = image.shape[0], image.shape[1]
    if name == "AutoContrast":
        return adjust.autocontrast(image)
    if name == "Equalize":
        return adjust.equalize(image)
    if name == "Invert":
        return adjust.invert(image)
    if name == "Rotate":
        return adjust.projective(image, adjust.rotation(argument, height, width))
    if name == "Posterize":
        bits = tf.cast(argument, image.dtype) if isinstance(argument, tf.Tensor) else argument
        return adjust.posterize(image, bits)
    if name == "Solarize":
        return adjust.solarize(image, argument)
    if name == "SolarizeAdd":
        return adjust.solarize_add(image, argument)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return getattr(adjust, name.lower())(image, argument)
    if name in ("ShearX", "ShearY"):
        return adjust.sheared(image, argument, horizontal=name == "ShearX")
    if name in ("TranslateX", "TranslateY"):
        return adjust.shifted(image, argument, horizontal=name == "TranslateX")
    if name == "Cutout":
        return adjust.cutout(image, argument, center_y, center_x)
    raise ValueError(f"unknown RandAugment op {name!r}")


def _check(num_layers: int, magnitude: float, magnitude_std: float, prob_to_apply: Optional[float],
           ops: Optional[Sequence[str]]) -> tuple[str, ...]:
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ConfigError(f"op 'randaugment': num_layers must be a positive int (2 in most recipes), got {num_layers!r}")
    if not 0 <= magnitude <= MAX_LEVEL:
        raise ConfigError(f"op 'randaugment': magnitude must be within 0..10 (TFM's scale; 9 in DeiT), got {magnitude!r}")
    if magnitude_std < 0:
        raise ConfigError(f"op 'randaugment': magnitude_std must be >= 0, got {magnitude_std!r}")
    if prob_to_apply is not None and not 0 <= prob_to_apply <= 1:
        raise ConfigError(f"op 'randaugment': prob_to_apply must be within 0..1 (or null), got {prob_to_apply!r}")
    chosen = tuple(OPS if ops is None else ops)
    unknown = [name for name in chosen if name not in OPS]
    if unknown or not chosen or isinstance(ops, str):
        raise ConfigError(f"op 'randaugment': ops must be a non-empty list of {', '.join(OPS)}; "
                          f"got {ops!r}" + (f" ({', '.join(map(str, unknown))} unknown)" if unknown else ""))
    return chosen


@register_op("randaugment", random=True)
@keyed(default_key="image")
def randaugment(num_layers: int = 2, magnitude: float = 10.0, ops: Optional[Sequence[str]] = None,
                cutout_const: float = 40.0, translate_const: float = 100.0, magnitude_std: float = 0.0,
                prob_to_apply: Optional[float] = None):
    """RandAugment: `num_layers` ops, each chosen at random among `ops` (default: all 16 of TFM's) or
    none, applied at `magnitude` (0..10). `magnitude_std` adds Gaussian noise to the magnitude per layer
    (timm's); `prob_to_apply` applies each layer with that probability. Static-shaped, on one image."""
    chosen = _check(num_layers, float(magnitude), float(magnitude_std), prob_to_apply, ops)

    def layer(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        draws = tf.random.stateless_uniform([5], seed=seed)
        level: tf.Tensor | float = float(magnitude)
        if magnitude_std > 0:
            noise = tf.random.stateless_normal([], seed=tf.random.experimental.stateless_fold_in(seed, 1))
            level = tf.clip_by_value(float(magnitude) + magnitude_std * noise, 0.0, MAX_LEVEL)
        choice = tf.minimum(tf.cast(draws[_CHOICE] * (len(chosen) + 1), tf.int32), len(chosen))
        side = tf.where(draws[_SIDE] < 0.5, 1.0, -1.0)
        center_y = tf.cast(draws[_CENTER_Y] * image.shape[0], tf.int32)
        center_x = tf.cast(draws[_CENTER_X] * image.shape[1], tf.int32)

        def branch(name: str) -> Callable[[], tf.Tensor]:
            def run() -> tf.Tensor:
                argument = op_argument(name, level, cutout_const, translate_const)
                if name in SIGNED:
                    argument = side * argument
                return apply_op(name, image, argument, center_y, center_x)
            return run

        changed = tf.switch_case(choice, [branch(name) for name in chosen] + [lambda: tf.identity(image)])
        if prob_to_apply is not None:
            changed = tf.where(draws[_APPLY] < prob_to_apply, changed, image)
        return tf.ensure_shape(changed, image.shape)

    def fn(image: tf.Tensor, seed: Optional[tf.Tensor] = None) -> tf.Tensor:
        if image.shape.rank != 3 or not image.shape.is_fully_defined():
            raise one_line(f"op 'randaugment': needs one image of a static shape [height, width, channels] (values "
                           f"0..255), got {image.shape}; put it after an op that makes a fixed size "
                           f"(decode_and_random_crop_jpeg, resize)")
        dtype = image.dtype
        pixels = image if dtype == tf.uint8 else tf.cast(
            tf.clip_by_value(image, tf.cast(0, dtype), tf.cast(255, dtype)), tf.uint8)
        for index in range(num_layers):
            pixels = layer(pixels, tf.random.experimental.stateless_fold_in(seed, index))
        return pixels if dtype == tf.uint8 else tf.cast(pixels, dtype)

    return fn


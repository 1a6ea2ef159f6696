"""`mixup_cutmix`: mixup (Zhang et al., arXiv 1710.09412) and CutMix (Yun et al., arXiv 1905.04899) on a batch.

A batch-level op (`register_op(..., batch_level=True)`): the pipeline runs it on each per-replica
batch, after the batch is made, with a seed of its own per batch. Each example is mixed with its
partner in the reversed batch (timm's and tensorflow/models' "batch" mode), and its integer label
becomes a soft target of `num_classes` values: `label_smoothing` first (1 - s + s/C on the class, s/C
elsewhere), then the two examples' targets weighed by λ and 1 - λ. The targets of every example sum
to 1. With probability 1 - `prob` the batch is left unmixed (its targets still smoothed).

- mixup: λ ~ Beta(mixup_alpha, mixup_alpha) per example, drawn as G1 / (G1 + G2) with G1, G2 ~
  Gamma(α). (Both draws use α: tensorflow/models drew one with β = 1 until #13525, keras-cv too.)
- CutMix: λ ~ Beta(cutmix_alpha, cutmix_alpha) sets a box of sides sqrt(1 - λ) H by sqrt(1 - λ) W
  (TFM takes both sides from H) at a uniform center, cut at the borders; the partner's pixels are
  pasted there, and λ is then set from the box actually pasted: 1 - pasted / (H W). So the label
  weight is the pixel share, also where the box is cut (TFM keeps the uncut box's area).
- `switch_prob`: the chance a batch takes CutMix rather than mixup (1 with only CutMix on, 0 with only
  mixup), as in TFM and timm.

Shapes stay static: the box is a mask, never a slice.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import image_adjust as adjust
from tpu_pipeline.ops._util import feature, one_line
from tpu_pipeline.ops.registry import register_op


def beta(seed: tf.Tensor, alpha: float, shape: tf.Tensor) -> tf.Tensor:
    """Beta(alpha, alpha) draws: G1 / (G1 + G2), both Gamma(alpha)."""
    first = tf.random.stateless_gamma(shape, seed=tf.random.experimental.stateless_fold_in(seed, 0), alpha=alpha)
    second = tf.random.stateless_gamma(shape, seed=tf.random.experimental.stateless_fold_in(seed, 1), alpha=alpha)
    return first / (first + second)


def smoothed(labels: tf.Tensor, num_classes: int, label_smoothing: float) -> tf.Tensor:
    """One-hot float32 targets with label smoothing: 1 - s + s/C on the class, s/C elsewhere."""
    off = label_smoothing / num_classes
    return tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), num_classes, on_value=1.0 - label_smoothing + off,
                      off_value=off)


def blended(images: tf.Tensor, own: tf.Tensor) -> tf.Tensor:
    """own * image + (1 - own) * partner, `own` broadcast over the image ([B, 1, 1, 1] or [B, H, W, 1]); in
    float32 for any other image dtype (bfloat16 arithmetic is slow on the host), in the image's dtype after."""
    compute = images.dtype if images.dtype in (tf.float32, tf.float64) else tf.float32
    values, own = tf.cast(images, compute), tf.cast(own, compute)
    return tf.cast(values * own + tf.reverse(values, [0]) * (1 - own), images.dtype)


def mixup(images: tf.Tensor, seed: tf.Tensor, alpha: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Each image blended with its partner in the reversed batch: (images, λ per example)."""
    lam = beta(seed, alpha, tf.shape(images)[:1])
    return blended(images, tf.reshape(lam, [-1, 1, 1, 1])), lam


def cutmix_boxes(seed: tf.Tensor, alpha: float, batch: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """int32 [batch, 4]: each example's (top, bottom, left, right), cut at the borders."""
    lam = beta(seed, alpha, batch[None])
    ratio = tf.sqrt(1.0 - lam)
    cut_height = tf.cast(ratio * height, tf.int32)
    cut_width = tf.cast(ratio * width, tf.int32)
    centers = tf.random.stateless_uniform([2, batch], seed=tf.random.experimental.stateless_fold_in(seed, 2))
    center_y = tf.cast(centers[0] * height, tf.int32)
    center_x = tf.cast(centers[1] * width, tf.int32)
    return tf.stack([tf.maximum(center_y - cut_height // 2, 0), tf.minimum(center_y + cut_height // 2, height),
                     tf.maximum(center_x - cut_width // 2, 0), tf.minimum(center_x + cut_width // 2, width)], axis=1)


def cutmix(images: tf.Tensor, seed: tf.Tensor, alpha: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Each image with a box of its partner's pasted in: (images, λ = the share of its own pixels kept)."""
    height, width = images.shape[1], images.shape[2]
    boxes = cutmix_boxes(seed, alpha, tf.shape(images)[0], height, width)
    top, bottom, left, right = tf.unstack(boxes, axis=1)
    pasted = adjust.box_mask(height, width, top, bottom, left, right)
    lam = 1.0 - tf.cast((bottom - top) * (right - left), tf.float32) / float(height * width)
    # A product, not tf.where (a select costs more on the host); with weights 0 and 1 the pixels are exact.
    return blended(images, 1.0 - tf.cast(pasted, tf.float32)), lam


@register_op("mixup_cutmix", random=True, batchable=True, batch_level=True)
def mixup_cutmix(num_classes: int, mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, prob: float = 1.0,
                 switch_prob: float = 0.5, label_smoothing: float = 0.1, image_key: str = "image",
                 label_key: str = "label"):
    """Mixes each batch's examples with mixup or CutMix (as DeiT: 0.8, 1.0, switch 0.5, smoothing 0.1); the
    integer labels under `label_key` become soft float32 targets [batch, num_classes]. Never on evaluation."""
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ConfigError(f"op 'mixup_cutmix': num_classes must be an int >= 2 (the classes' width), got {num_classes!r}")
    for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
        if not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"op 'mixup_cutmix': {name} must be >= 0 (0 turns it off), got {value!r}")
    if not mixup_alpha and not cutmix_alpha:
        raise ConfigError("op 'mixup_cutmix': mixup_alpha and cutmix_alpha are both 0, so nothing would mix; "
                          "set one above 0 (DeiT: 0.8 and 1.0), or use label smoothing alone (model.label_smoothing)")
    for name, value in (("prob", prob), ("switch_prob", switch_prob), ("label_smoothing", label_smoothing)):
        if not 0 <= value <= 1:
            raise ConfigError(f"op 'mixup_cutmix': {name} must be within 0..1, got {value!r}")
    cutmix_share = 1.0 if not mixup_alpha else 0.0 if not cutmix_alpha else float(switch_prob)

    def fn(features: dict, seed: Optional[tf.Tensor] = None) -> dict:
        images = feature(features, image_key, "mixup_cutmix")
        labels = feature(features, label_key, "mixup_cutmix")
        if images.shape.rank != 4 or not images.shape[1:].is_fully_defined():
            raise one_line(f"op 'mixup_cutmix': '{image_key}' must be a batch of images [batch, height, width, "
                           f"channels] of a static size, got {images.shape}")
        if labels.dtype.is_floating or labels.shape.rank not in (1, 2) or (labels.shape.rank == 2 and labels.shape[1] != 1):
            raise one_line(f"op 'mixup_cutmix': '{label_key}' must hold one integer class id per example, got "
                           f"{labels.dtype.name} {labels.shape}; remove any 'onehot' op before it")
        targets = smoothed(labels, num_classes, label_smoothing)
        draws = tf.random.stateless_uniform([2], seed=tf.random.experimental.stateless_fold_in(seed, 0))
        mix_seed = tf.random.experimental.stateless_fold_in(seed, 1)

        def mixed() -> tuple[tf.Tensor, tf.Tensor]:
            if cutmix_share in (0.0, 1.0):  # one of the two is off: no branch for it
                out, lam = (cutmix if cutmix_share else mixup)(images, mix_seed, cutmix_alpha or mixup_alpha)
            else:
                out, lam = tf.cond(draws[1] < cutmix_share, lambda: cutmix(images, mix_seed, cutmix_alpha),
                                   lambda: mixup(images, mix_seed, mixup_alpha))
            weight = lam[:, None]
            return out, weight * targets + (1.0 - weight) * tf.reverse(targets, [0])

        if prob >= 1:
            images, targets = mixed()
        else:
            images, targets = tf.cond(draws[0] < prob, mixed, lambda: (tf.identity(images), targets))
        return {**features, image_key: images, label_key: targets}

    return fn

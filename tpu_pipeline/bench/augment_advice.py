"""What `doctor` says when image augmentation is the input's bottleneck, and how to fix it.

RandAugment, random erasing and mixup / CutMix cost the host about twice what decoding and cropping a
224 x 224 JPEG cost (benchmarks/README.md, issue 49), so on a TPU host they are often the costliest stage.
The fixes, cheapest first: more cores on the map (its parallel calls; tf.data service workers on other
machines), cheaper ops (fewer RandAugment layers, or its costliest ops left out), and the batch mix moved to
the accelerator, as big_vision mixes under its model's step.
"""
from __future__ import annotations

from typing import Optional

AUGMENTATION_OPS = ("randaugment", "random_erasing", "mixup_cutmix")
# RandAugment's ops that cost the host most on 224 x 224 (ms of CPU each, measured in issue 49): 2-2.3 ms
# against 0.3-0.6 for Invert, Posterize, the shifts and Brightness.
COSTLIEST_RANDAUGMENT_OPS = ("Equalize", "Sharpness", "Rotate")


def augmentation_advice(stage: str) -> Optional[str]:
    """The advice when the costliest stage (`doctor`'s name for it, e.g. "augment[2] randaugment") is an
    augmentation op; None otherwise."""
    named = [op for op in AUGMENTATION_OPS if stage.endswith(f" {op}") or f" {op} + " in stage]
    if not named:
        return None
    return (f"image augmentation ({', '.join(named)}) is the costliest stage: give it more cores (a larger "
            "data.num_parallel_calls, or tf.data service workers: tpu-pipeline serve), make it cheaper (randaugment "
            f"with fewer num_layers, or ops without {', '.join(COSTLIEST_RANDAUGMENT_OPS)}), or mix the batches on "
            "the accelerator instead (mixup_cutmix out of data.augment, mixed in the model's step as big_vision "
            "does)")

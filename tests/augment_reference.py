"""What the augmentation tests compare with: tensorflow/models' own `official/vision/ops/augment.py`, loaded from
the installed tf-models-official package (scripts/setup_env.sh puts it in with --no-deps), and real photographs.

`official.vision`'s `__init__` imports every vision task (pycocotools, cv2, ...), and `official.core`'s imports
orbit, which needs TensorFlow 2.20's TPU internals (the TPU TensorFlow is 2.19). So those packages and the two on
the way to the module are entered as bare packages over their folders; the module itself and the modules it
imports (`official.vision.configs.common`, `official.vision.ops.box_ops`, `official.core.config_definitions`,
`official.modeling`) load as they are.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types

import numpy as np


def enter_bare(packages: tuple[str, ...]) -> None:
    """Puts each of tf-models-official's `packages` in sys.modules as a bare package over its folder, so its
    modules import without the package's `__init__` (benchmarks/bench_augment.py enters TFM's input reader too)."""
    spec = importlib.util.find_spec("official")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tf-models-official is not installed: run `bash scripts/setup_env.sh` (it installs it "
                          "with --no-deps as the augmentation tests' reference)")
    root = list(spec.submodule_search_locations)[0]
    for package in packages:
        if package not in sys.modules:
            module = types.ModuleType(package)
            module.__path__ = [os.path.join(root, *package.split(".")[1:])]
            sys.modules[package] = module


@functools.lru_cache(maxsize=None)
def tfm_augment() -> types.ModuleType:
    """tensorflow/models' augment module (TFM's RandAugment, RandomErasing, MixupAndCutmix and their ops)."""
    enter_bare(("official.core", "official.vision", "official.vision.ops", "official.vision.configs"))
    return importlib.import_module("official.vision.ops.augment")


@functools.lru_cache(maxsize=None)
def photos(size: int = 224) -> np.ndarray:
    """uint8 [2, size, size, 3]: the two photographs scikit-learn ships (a temple in China, a flower), each the
    central square of the photo resized to `size` (area averaging, as a crop to 224 would be)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    squares = []
    for photo in load_sample_images().images:
        height, width = photo.shape[:2]
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        square = Image.fromarray(photo[top:top + side, left:left + side])
        squares.append(np.asarray(square.resize((size, size), Image.BOX)))
    return np.stack(squares)

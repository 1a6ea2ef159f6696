"""The built-in demo dataset: geometric shapes as real JPEG bytes in sharded TFRecords.

Small but real: random colours, sizes, positions and pixel noise, so a small CNN has to learn
shape (not colour) and needs a few epochs to get there. Written once into a cache directory.
"""
from __future__ import annotations

import os
from typing import Iterator

from absl import logging
import numpy as np
import tensorflow as tf

from tpu_pipeline.format import read_metadata, write_metadata
from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split
from tpu_pipeline.system import default_cache_dir

CLASS_NAMES = ("circle", "square", "triangle", "cross")
VERSION = "v1"


def _mask(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    radius = rng.uniform(0.18, 0.38) * size
    cy, cx = rng.uniform(radius + 1, size - radius - 1, size=2)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = yy - cy, xx - cx
    if label == 0:  # circle
        return dy**2 + dx**2 <= radius**2
    if label == 1:  # square (axis-aligned)
        half = radius * 0.85
        return (np.abs(dy) <= half) & (np.abs(dx) <= half)
    if label == 2:  # upward triangle
        top, base = cy - radius, cy + radius * 0.8
        inside_y = (yy >= top) & (yy <= base)
        half_width = (yy - top) / (base - top) * radius
        return inside_y & (np.abs(dx) <= half_width)
    arm = radius * 0.3  # cross
    return ((np.abs(dy) <= arm) & (np.abs(dx) <= radius)) | ((np.abs(dx) <= arm) & (np.abs(dy) <= radius))


def render(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """One uint8 [size, size, 3] image of class `label`."""
    background = rng.uniform(0, 255, size=3)
    foreground = (background + rng.uniform(90, 165, size=3)) % 256  # always distinguishable
    image = np.empty((size, size, 3), np.float32)
    image[:] = background
    image[_mask(label, size, rng)] = foreground
    image += rng.normal(0, 12, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def examples(num: int, size: int, seed: int) -> Iterator[bytes]:
    """Serialized tf.Examples: image (JPEG bytes), label, height, width, label_name, id."""
    rng = np.random.default_rng(seed)
    for index in range(num):
        label = int(rng.integers(len(CLASS_NAMES)))
        jpeg = tf.io.encode_jpeg(render(label, size, rng), quality=90).numpy()
        features = {
            "image": bytes_feature(jpeg),
            "label": int_feature(label),
            "label_name": bytes_feature(CLASS_NAMES[label].encode()),
            "height": int_feature(size),
            "width": int_feature(size),
            "id": int_feature(index),
        }
        yield tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


FEATURES = {
    "image": {"dtype": "string"},
    "label": {"dtype": "int64"},
    "label_name": {"dtype": "string"},
    "height": {"dtype": "int64"},
    "width": {"dtype": "int64"},
    "id": {"dtype": "int64"},
}


def ensure_demo_dataset(
    cache_dir: str | None = None, num_train: int = 4096, num_eval: int = 1024, size: int = 64, num_shards: int = 8
) -> str:
    """Writes the demo set once (reused when its metadata exists); returns its directory."""
    out_dir = os.path.join(cache_dir or default_cache_dir(), "demo_shapes", f"{VERSION}-{size}px-{num_train}-{num_eval}")
    metadata = read_metadata(out_dir)
    if metadata is not None:
        return out_dir
    splits = {
        "train": write_split(examples(num_train, size, seed=1), out_dir, "train", num_shards),
        "validation": write_split(examples(num_eval, size, seed=2), out_dir, "validation", max(1, num_shards // 4)),
    }
    write_metadata(
        out_dir,
        {
            "name": "demo_shapes",
            "source": "tpu_pipeline.records.demo_shapes",
            "features": FEATURES,
            "class_names": list(CLASS_NAMES),
            "image_size": size,
            "splits": splits,
        },
    )
    logging.info("wrote the built-in demo data (%d training and %d validation %dx%d images) to %s; later runs "
                 "reuse it (TPU_PIPELINE_CACHE moves it)", num_train, num_eval, size, size, out_dir)
    return out_dir

"""Small real TFRecord sets written from a feature spec (the `data.features` shape of a config)."""
from __future__ import annotations

import math
import os
from typing import Any, Mapping

import numpy as np
import tensorflow as tf

from tpu_pipeline.records.writer import write_split


def _feature(spec: Mapping[str, Any], name: str, index: int, rng: np.random.Generator, image_size: int) -> tf.train.Feature:
    dtype, shape = spec.get("dtype", "float32"), list(spec.get("shape", []))
    count = math.prod(shape) if shape else 1
    if dtype == "string":
        if "image" in name:
            pixels = rng.integers(0, 256, size=(image_size, image_size, 3), dtype=np.uint8)
            values = [tf.io.encode_jpeg(pixels).numpy() for _ in range(count)]
        else:
            values = [f"{name}-{index}-{k}".encode() for k in range(count)]
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if dtype == "int64":
        values = [index % 10] * count if name == "label" else rng.integers(0, 100, size=count).tolist()
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
    return tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(size=count).astype(np.float32).tolist()))


def write_tfrecords(directory: Any, features: Mapping[str, Mapping[str, Any]], num: int, num_shards: int = 4,
                    seed: int = 0, image_size: int = 16) -> str:
    """Writes `num` tf.Examples with the given features (random values; a real JPEG for string
    features named like 'image'; label = index % 10) plus an int64 `id` = index, round-robin over
    `num_shards` files; returns their glob for `data.source.files`."""
    rng = np.random.default_rng(seed)

    def examples():
        for index in range(num):
            feature = {name: _feature(spec, name, index, rng, image_size) for name, spec in features.items()}
            feature["id"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[index]))
            yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split(examples(), str(directory), "train", num_shards)
    return os.path.join(str(directory), "train-*.tfrecord")

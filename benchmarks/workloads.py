"""The two reference workloads of the throughput benchmark, generated deterministically.

W1 images: 4096 JPEGs of 375x500 (~100 KB, photo-like: smooth regions, edges and texture)
in 16 shards. W2 small records: 524288 tf.Examples of 16 floats + 2 ints in 8 shards.
Written once into $TPU_PIPELINE_CACHE/bench (or --cache_dir), with the package's safe writer.
"""
from __future__ import annotations

import os
import sys
from typing import Iterator

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from tpu_pipeline.system import default_cache_dir  # noqa: E402
from tpu_pipeline.format import read_metadata, write_metadata  # noqa: E402
from tpu_pipeline.records.writer import bytes_feature, float_feature, int_feature, write_split  # noqa: E402

W1_IMAGES, W1_SHARDS, W1_HEIGHT, W1_WIDTH = 4096, 16, 375, 500
W2_RECORDS, W2_SHARDS, W2_FLOATS = 524_288, 8, 16


def bench_dir(cache_dir: str | None = None) -> str:
    return os.path.join(cache_dir or default_cache_dir(), "bench")


def _photo_like(rng: np.random.Generator) -> np.ndarray:
    """Smooth colour fields, a few hard-edged blobs and fine texture: compresses like a photo."""
    h, w = W1_HEIGHT, W1_WIDTH
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    image = np.zeros((h, w, 3), np.float32)
    for channel in range(3):
        fy, fx, phase = rng.uniform(0.002, 0.02, 2).tolist() + [rng.uniform(0, 6.3)]
        image[..., channel] = 128 + 90 * np.sin(fy * yy * 6.3 + phase) * np.cos(fx * xx * 6.3)
    for _ in range(6):
        cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(20, 90)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.uniform(0, 255, 3)
    image += rng.normal(0, 14, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def w1_examples(seed: int = 0) -> Iterator[bytes]:
    rng = np.random.default_rng(seed)
    for index in range(W1_IMAGES):
        jpeg = tf.io.encode_jpeg(_photo_like(rng), quality=92).numpy()
        feature = {
            "image": bytes_feature(jpeg), "label": int_feature(index % 1000),
            "height": int_feature(W1_HEIGHT), "width": int_feature(W1_WIDTH), "id": int_feature(index),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def w2_examples(seed: int = 0) -> Iterator[bytes]:
    rng = np.random.default_rng(seed)
    floats = rng.normal(size=(W2_RECORDS, W2_FLOATS)).astype(np.float32)
    for index in range(W2_RECORDS):
        feature = {
            "features": float_feature(floats[index].tolist()),
            "label": int_feature(index % 2), "id": int_feature(index),
        }
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def ensure(name: str, cache_dir: str | None = None) -> str:
    """The workload's directory, generated on first use (metadata.json marks it complete)."""
    out_dir = os.path.join(bench_dir(cache_dir), name)
    if read_metadata(out_dir) is None:
        if name == "w1_images":
            split = write_split(w1_examples(), out_dir, "train", W1_SHARDS)
            features = {"image": {"dtype": "string"}, "label": {"dtype": "int64"}}
        elif name == "w2_small":
            split = write_split(w2_examples(), out_dir, "train", W2_SHARDS)
            features = {"features": {"dtype": "float32", "shape": [W2_FLOATS]}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}}
        else:
            raise ValueError(f"unknown workload {name!r}: w1_images or w2_small")
        write_metadata(out_dir, {"name": name, "source": "benchmarks/workloads.py", "features": features,
                                 "splits": {"train": split}})
    return out_dir


def files(name: str, cache_dir: str | None = None) -> str:
    return os.path.join(ensure(name, cache_dir), "train-*.tfrecord")


if __name__ == "__main__":
    for workload in ("w1_images", "w2_small"):
        path = ensure(workload)
        total = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        print(f"{workload}: {path} ({total / 2**20:.0f} MiB)")


# --- The per-example work of each workload, and our pipeline's config for it -----------------

import dataclasses  # noqa: E402
from typing import Any, Callable  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Workload:
    """What every pipeline in the comparison must compute for each example."""

    name: str
    batch_size: int
    spec: dict[str, Any]
    preprocess: Callable[[dict, tf.Tensor], tuple]  # (parsed features, int64[2] seed) → (x, y)
    config: dict[str, Any]  # our pipeline's data section, knobs left at their defaults

    def decode(self, serialized: tf.Tensor) -> dict:
        return tf.io.parse_single_example(serialized, self.spec)

    def work(self, serialized: tf.Tensor, seed: tf.Tensor) -> tuple:
        return self.preprocess(self.decode(serialized), seed)


def _w1_preprocess(features: dict, seed: tf.Tensor) -> tuple:
    from tpu_pipeline.ops import get_op

    crop = get_op("decode_and_random_crop_jpeg").build({"size": 224})
    flip = get_op("random_flip").build({})
    features = crop(features, tf.random.experimental.stateless_fold_in(seed, 0))
    features = flip(features, tf.random.experimental.stateless_fold_in(seed, 1))
    return tf.cast(features["image"], tf.bfloat16), tf.cast(features["label"], tf.int32)


def _w2_preprocess(features: dict, seed: tf.Tensor) -> tuple:
    return features["features"], tf.cast(features["label"], tf.int32)


def workload(name: str, cache_dir: str | None = None) -> Workload:
    pattern = files(name, cache_dir)
    if name == "w1_images":
        return Workload(
            name=name, batch_size=128,
            spec={"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)},
            preprocess=_w1_preprocess,
            config={
                "source": {"type": "tfrecord", "files": pattern},
                "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}},
                "augment": [
                    {"op": "decode_and_random_crop_jpeg", "size": 224},
                    {"op": "random_flip"},
                    {"op": "cast", "dtype": "bfloat16"},
                    {"op": "cast", "key": "label", "dtype": "int32"},
                ],
                # Raw JPEG records: a modest buffer on top of the file shuffle and the 16-file
                # interleave (a big one evicts the bytes from cache before they are decoded).
                "shuffle": {"buffer_size": 256},
                "repeat": "forever",
                "batch_size": 128,
                "outputs": {"inputs": "image", "targets": "label"},
            },
        )
    return Workload(
        name=name, batch_size=1024,
        spec={"features": tf.io.FixedLenFeature([W2_FLOATS], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64)},
        preprocess=_w2_preprocess,
        config={
            "source": {"type": "tfrecord", "files": pattern},
            "features": {"features": {"dtype": "float32", "shape": [W2_FLOATS]}, "label": {"dtype": "int64"}},
            "augment": [{"op": "cast", "key": "label", "dtype": "int32"}],
            "shuffle": {"buffer_size": 10_000},
            "repeat": "forever",
            "batch_size": 1024,
            "outputs": {"inputs": "features", "targets": "label"},
        },
    )

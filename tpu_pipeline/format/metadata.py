"""metadata.json and shard names of a dataset directory written by `tpu-pipeline convert` (or the demo).

The metadata file is written last, via a temporary file and a rename: its presence is the mark
of a finished dataset, so a reader never takes a half-written directory for a complete one.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Mapping, Optional

import tensorflow as tf

from tpu_pipeline.config.data import FeatureConfig
from tpu_pipeline.errors import DataError
from tpu_pipeline.format.sniff import convert_hint, kind_of_folder
from tpu_pipeline.system import local_path

METADATA_FILE = "metadata.json"
DEFAULT_SPLIT = "train"


def shard_name(split: str, index: int, num_shards: int, compression: str = "") -> str:
    suffix = {"": "", "GZIP": ".gz", "ZLIB": ".zz"}[compression]
    return f"{split}-{index:05d}-of-{num_shards:05d}.tfrecord{suffix}"


def write_metadata(out_dir: str, metadata: Mapping[str, Any]) -> str:
    """Writes metadata.json last (via a temporary file and a rename): the dataset's 'complete' mark."""
    path = tf.io.gfile.join(out_dir, METADATA_FILE)
    temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    body = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **metadata}
    with tf.io.gfile.GFile(temp, "w") as handle:
        handle.write(json.dumps(body, indent=2, sort_keys=True))
    tf.io.gfile.rename(temp, path, overwrite=True)
    return path


CONVERT_SOURCES = "text|chat|parquet|hf|image-folder|csv|numpy|tfds"  # what `tpu-pipeline convert --from` takes


def read_metadata(out_dir: str) -> Optional[dict[str, Any]]:
    """The metadata of a finished dataset directory, or None when it is absent (unfinished)."""
    path = tf.io.gfile.join(out_dir, METADATA_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "r") as handle:
        return json.loads(handle.read())


def read_dataset_metadata(directory: str, key: str = "data.source") -> dict[str, Any]:
    """metadata.json of a finished dataset directory; a DataError naming the fix otherwise."""
    directory = local_path(directory)
    metadata = read_metadata(directory)
    if metadata is not None:
        return metadata
    if tf.io.gfile.isdir(directory):
        kind, files = kind_of_folder(directory)
        if kind is not None:
            raise DataError(f"{key}.dir: {directory!r}: {convert_hint(kind, files, directory.rstrip('/') + '_converted')}")
        raise DataError(
            f"{key}.dir: {directory!r} has no {METADATA_FILE}, so its conversion did not finish (or it was not "
            "written by `tpu-pipeline convert`); run the same convert command again to finish it"
        )
    if "demo_shapes" in directory:
        raise DataError(f"{key}.dir: {directory!r} does not exist: it is the built-in demo data, which "
                        "`tpu-pipeline demo` (or `tpu-pipeline train` without --config) writes on first use")
    raise DataError(f"{key}.dir: {directory!r} does not exist; create it with `tpu-pipeline convert --from "
                    f"{CONVERT_SOURCES} SOURCE --out {directory}`, or point {key}.dir at a converted dataset")


def load_dataset_dir(directory: str, split: Optional[str] = None, key: str = "data.source") -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, the split's entry: files, counts, num_examples) of a finished dataset directory."""
    metadata = read_dataset_metadata(directory, key)
    split = split or DEFAULT_SPLIT
    splits = metadata.get("splits") or {}
    if split not in splits:
        raise DataError(f"{key}.split={split}: {directory!r} has no split {split!r}; its splits: {sorted(splits)}; "
                        + _split_fix(key, list(splits)))
    return metadata, splits[split]


def _split_fix(key: str, splits: list[str]) -> str:
    """What to set instead of a split the dataset lacks: the likeliest first (an evaluation's held-out split, a
    training run's train split), then the others."""
    if not splits:
        return "convert the data again"
    likely = ("validation", "test", "eval", "dev") if key.startswith("eval_data") else ("train",)
    ranked = sorted(splits, key=lambda name: (likely.index(name) if name in likely else len(likely), name))
    return f"set {key}.split={ranked[0]}" + (f" (or {', '.join(ranked[1:])})" if ranked[1:] else "")


def dir_features(directory: str, key: str = "data.source") -> dict[str, FeatureConfig]:
    """The metadata's feature spec as config objects (what `data.features` would hold)."""
    features = read_dataset_metadata(directory, key).get("features") or {}
    if not features:
        raise DataError(f"{key}.dir: {directory!r}: {METADATA_FILE} has no feature spec; set data.features")
    return {name: FeatureConfig(**entry) for name, entry in features.items()}

"""NumPy arrays from a .npz file (np.savez(path, image=..., label=...)): one tf.Example per row.

Each array becomes a feature with its per-example shape (bool and integers → int64, floats →
float32, fixed-width strings → string). A string label array becomes class ids plus `label_name`.
With `reencode`, uint8 image arrays ([N, H, W] or [N, H, W, C]) are stored as PNG or JPEG bytes, which
the decode ops read, instead of one int64 per pixel.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.records.examples import class_ids, feature, numpy_dtype_kind, serialize, spec
from tpu_pipeline.records.sharding import RECORD_OVERHEAD, assign_splits, split_fractions
from tpu_pipeline.system import local_path


def load_npz(path: str) -> dict[str, np.ndarray]:
    if not path.endswith(".npz"):
        raise DataError(f"numpy: {path!r} is not a .npz file; save your arrays with np.savez(path, image=..., label=...)")
    if not tf.io.gfile.exists(path):
        raise DataError(f"numpy: {path!r} does not exist")
    with tf.io.gfile.GFile(path, "rb") as handle:
        try:
            loaded = np.load(handle, allow_pickle=False)
            arrays = {key: loaded[key] for key in loaded.files}
        except ValueError as error:  # object arrays need pickle, which we refuse
            raise DataError(f"numpy: {path}: {error}; store strings as fixed-width arrays (dtype=str)") from None
    if not arrays:
        raise DataError(f"numpy: {path} holds no arrays")
    lengths = {key: (len(value) if value.ndim else None) for key, value in arrays.items()}
    if None in lengths.values() or len(set(lengths.values())) != 1:
        raise DataError(f"numpy: {path}: every array needs the same first dimension (one row per example); given {lengths}")
    return arrays


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _is_image(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and (array.ndim == 3 or (array.ndim == 4 and array.shape[-1] in (1, 3, 4)))


class NumpySource:
    """Arrays in memory; `encode` serializes one row index."""

    kind = "numpy"

    def __init__(
        self, path: str, splits: str = "train", seed: int = 0, shuffle: bool = True,
        label_column: Optional[str] = "label", require_label: bool = False,
        class_names: Optional[Sequence[str]] = None, reencode: str = "", jpeg_quality: int = 95,
    ) -> None:
        if reencode not in ("", "jpeg", "png"):
            raise ConfigError(f"--reencode must be none, jpeg or png (given: {reencode!r})")
        self.path = local_path(path, absolute=True)
        self.name = os.path.splitext(os.path.basename(self.path))[0]
        self.seed, self.shuffle, self.reencode, self.jpeg_quality = seed, shuffle, reencode, jpeg_quality
        self.fractions = split_fractions(splits)
        self.arrays = load_npz(self.path)
        if label_column and label_column not in self.arrays and require_label:
            raise ConfigError(f"--label_column: no array {label_column!r} in {self.path}; its arrays: {sorted(self.arrays)}")
        self.label = label_column if label_column in self.arrays else None
        self.kinds = {key: numpy_dtype_kind(value.dtype, f"numpy: {self.path}: array {key!r}") for key, value in self.arrays.items()}
        self.images = sorted(key for key, value in self.arrays.items() if reencode and _is_image(value))
        self._class_names = list(class_names) if class_names else None
        self._label_ids: Optional[dict[str, int]] = None
        if self.label and self.kinds[self.label] == "string":
            if self.arrays[self.label].ndim != 1:
                raise DataError(f"numpy: {self.path}: the label array {self.label!r} must hold one string per example")
            if f"{self.label}_name" in self.arrays:
                raise DataError(
                    f"numpy: {self.path}: the string label array {self.label!r} becomes class ids plus "
                    f"{self.label}_name, which is already an array; rename that array"
                )
            values = [_text(v) for v in self.arrays[self.label].tolist()]
            self._class_names, self._label_ids = class_ids(values, class_names, f"numpy: {self.path}")
            unknown = sorted(set(values) - set(self._label_ids))
            if unknown:
                raise DataError(f"numpy: {self.path}: labels {unknown[:5]} are not among --class_names {self._class_names}")
        self.num_rows = len(next(iter(self.arrays.values())))
        self._splits = assign_splits(self.num_rows, self.fractions, seed, shuffle)

    def split_sizes(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self._splits.items()}

    def estimate_bytes(self, split: str) -> int:
        rows = self._splits[split]
        sample = rows[:: max(1, len(rows) // 64)]
        mean = sum(len(self.encode(int(i))) for i in sample) / len(sample)
        return int((mean + RECORD_OVERHEAD) * len(rows))

    def items(self, split: str, start: int) -> Iterator[int]:
        return iter(self._splits[split][start:].tolist())

    def encode(self, item: int) -> bytes:
        features: dict[str, tf.train.Feature] = {}
        for key, array in self.arrays.items():
            value = array[item]
            if key == self.label and self._label_ids is not None:
                name = _text(value.item())
                features[key] = feature(self._label_ids[name], "int64")
                features[f"{key}_name"] = feature(name, "string")
            elif key in self.images:
                pixels = value if value.ndim == 3 else value[..., None]
                if self.reencode == "jpeg":
                    data = tf.io.encode_jpeg(pixels[..., :3] if pixels.shape[-1] == 4 else pixels, quality=self.jpeg_quality)
                else:
                    data = tf.io.encode_png(pixels)
                features[key] = feature(data.numpy(), "string")
            else:
                features[key] = feature(value, self.kinds[key])
        return serialize(features)

    def features(self) -> dict[str, dict[str, Any]]:
        result = {}
        for key, array in self.arrays.items():
            if key == self.label and self._label_ids is not None:
                result[key] = spec("int64")
                result[f"{key}_name"] = spec("string")
            elif key in self.images:
                result[key] = spec("string")
            else:
                result[key] = spec(self.kinds[key], array.shape[1:])
        return result

    def class_names(self) -> Optional[list[str]]:
        return self._class_names

    def identity(self) -> dict[str, Any]:
        digest = hashlib.sha256()
        for key in sorted(self.arrays):
            digest.update(key.encode() + str(self.arrays[key].dtype).encode() + str(self.arrays[key].shape).encode())
            digest.update(np.ascontiguousarray(self.arrays[key]).tobytes())
        return {
            "kind": self.kind, "path": self.path, "content": digest.hexdigest(), "splits": self.fractions,
            "seed": self.seed, "shuffle": self.shuffle, "label": self.label, "class_names": self._class_names,
            "reencode": self.reencode, "jpeg_quality": self.jpeg_quality,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "path": self.path, "num_rows": self.num_rows,
            "arrays": {key: f"{value.dtype}{list(value.shape)}" for key, value in self.arrays.items()},
            "label_column": self.label, "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle,
            "reencode": self.reencode or None,
        }

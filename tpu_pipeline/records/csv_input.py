"""A CSV file with a header row: one tf.Example per line, numeric and string columns.

Column types are inferred from every value (int64 if all parse as integers, else float32 if all
parse as numbers, else string) unless given with `columns`. A string label column becomes class
ids (`label`) plus the original text (`label_name`). The file is read into memory once; a line that
cannot be converted is reported with its line number.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.records.convert_input import ItemError
from tpu_pipeline.records.examples import DTYPES, class_ids, feature, serialize, spec
from tpu_pipeline.records.sharding import RECORD_OVERHEAD, assign_splits, split_fractions
from tpu_pipeline.system import local_path

Row = tuple[int, list[str]]  # (line number, fields)


def _parses(cast: Callable[[str], object], text: str) -> bool:
    try:
        cast(text)
        return True
    except ValueError:
        return False


def infer_dtype(values: Sequence[str]) -> str:
    """int64, float32 or string for one column (empty cells do not vote)."""
    present = [v.strip() for v in values if v.strip()]
    if present and all(_parses(int, v) for v in present):
        return "int64"
    if present and all(_parses(float, v) for v in present):
        return "float32"
    return "string"


def parse_columns(text: str, flag: str = "--columns") -> dict[str, str]:
    """'age:int64,name:string' → {'age': 'int64', 'name': 'string'}."""
    columns: dict[str, str] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, dtype = part.rpartition(":")
        if not name or dtype not in DTYPES:
            raise ConfigError(f"{flag}: {part!r} must look like NAME:DTYPE with DTYPE one of {', '.join(DTYPES)}")
        columns[name] = dtype
    return columns


def read_rows(path: str) -> tuple[list[str], list[Row]]:
    """Header and data rows with their (first) line numbers. Local or any tf.io.gfile URL."""
    if not tf.io.gfile.exists(path):
        raise DataError(f"csv: {path!r} does not exist")
    with tf.io.gfile.GFile(path, "rb") as handle:
        raw = handle.read()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"csv: {path}, line {line}: not UTF-8 text ({error.reason}); save the file as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise DataError(f"csv: {path} is empty; it needs a header row naming the columns") from None
    header = [h.strip() for h in header]
    if not all(header) or len(set(header)) != len(header):
        raise DataError(f"csv: {path}, line 1: the header must name every column once (given: {header})")
    rows: list[Row] = []
    line = reader.line_num
    for fields in reader:
        start, line = line + 1, reader.line_num
        if fields:  # blank lines are not rows
            rows.append((start, fields))
    if not rows:
        raise DataError(f"csv: {path} has a header but no rows")
    return header, rows


class CsvSource:
    """Rows in memory; `encode` parses one row's cells to typed features (errors name the line)."""

    kind = "csv"

    def __init__(
        self, path: str, splits: str = "train", seed: int = 0, shuffle: bool = True,
        label_column: Optional[str] = "label", require_label: bool = False,
        columns: Optional[Mapping[str, str]] = None, class_names: Optional[Sequence[str]] = None,
    ) -> None:
        self.path = local_path(path, absolute=True)
        self.name = os.path.splitext(os.path.basename(self.path))[0]
        self.seed, self.shuffle = seed, shuffle
        self.fractions = split_fractions(splits)
        self.header, self.rows = read_rows(self.path)
        unknown = sorted(set(columns or {}) - set(self.header))
        if unknown:
            raise ConfigError(f"--columns: no column(s) {unknown} in {self.path}; its columns: {self.header}")
        if label_column and label_column not in self.header and require_label:
            raise ConfigError(f"--label_column: no column {label_column!r} in {self.path}; its columns: {self.header}")
        self.label = label_column if label_column in self.header else None
        width = len(self.header)
        good = [fields for _, fields in self.rows if len(fields) == width]
        self.dtypes = {
            name: (columns or {}).get(name) or infer_dtype([fields[i] for fields in good])
            for i, name in enumerate(self.header)
        }
        self._class_names: Optional[list[str]] = list(class_names) if class_names else None
        self._label_ids: Optional[dict[str, int]] = None
        if self.label and self.dtypes[self.label] == "string":
            if f"{self.label}_name" in self.header:
                raise DataError(
                    f"csv: {self.path}: the string label column {self.label!r} becomes class ids plus "
                    f"{self.label}_name, which is already a column; rename that column"
                )
            values = [fields[self.header.index(self.label)].strip() for fields in good]
            self._class_names, self._label_ids = class_ids(values, class_names, f"csv: {self.path}")
        self._splits = {name: [self.rows[i] for i in indices]
                        for name, indices in assign_splits(len(self.rows), self.fractions, seed, shuffle).items()}

    def split_sizes(self) -> dict[str, int]:
        return {name: len(rows) for name, rows in self._splits.items()}

    def estimate_bytes(self, split: str) -> int:
        rows = self._splits[split]
        step = max(1, len(rows) // 256)
        sizes = []
        for row in rows[::step]:
            try:
                sizes.append(len(self.encode(row)))
            except ItemError:
                continue
        mean = sum(sizes) / len(sizes) if sizes else 100
        return int((mean + RECORD_OVERHEAD) * len(rows))

    def items(self, split: str, start: int) -> Iterator[Row]:
        return iter(self._splits[split][start:])

    def encode(self, item: Row) -> bytes:
        line, fields = item
        where = f"{self.path}, line {line}"
        if len(fields) != len(self.header):
            raise ItemError(where, f"{len(fields)} fields where the header has {len(self.header)}")
        features: dict[str, tf.train.Feature] = {}
        for name, text in zip(self.header, fields):
            dtype, value = self.dtypes[name], text.strip()
            if name == self.label and self._label_ids is not None:
                if value not in self._label_ids:
                    raise ItemError(where, f"label {value!r} is not one of the class names {self._class_names}")
                features[name] = feature(self._label_ids[value], "int64")
                features[f"{name}_name"] = feature(value, "string")
                continue
            if dtype == "string":
                features[name] = feature(text, "string")
                continue
            if not value:
                raise ItemError(where, f"column {name!r} ({dtype}) is empty")
            try:
                number = int(value) if dtype == "int64" else float(value)
            except ValueError:
                raise ItemError(where, f"column {name!r} ({dtype}): {value!r} is not a number") from None
            if name == self.label and self._class_names and not 0 <= number < len(self._class_names):
                raise ItemError(where, f"label {number} is not a class id in 0..{len(self._class_names) - 1}")
            features[name] = feature(number, dtype)
        return serialize(features)

    def features(self) -> dict[str, dict[str, Any]]:
        result = {}
        for name in self.header:
            if name == self.label and self._label_ids is not None:
                result[name] = spec("int64")
                result[f"{name}_name"] = spec("string")
            else:
                result[name] = spec(self.dtypes[name])
        return result

    def class_names(self) -> Optional[list[str]]:
        return self._class_names

    def identity(self) -> dict[str, Any]:
        stat = tf.io.gfile.stat(self.path)
        content = hashlib.sha256(repr(self.rows[:1000]).encode()).hexdigest()
        return {
            "kind": self.kind, "path": self.path, "size": stat.length, "mtime": stat.mtime_nsec, "head": content,
            "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle, "label": self.label,
            "dtypes": self.dtypes, "class_names": self._class_names,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "path": self.path, "num_rows": len(self.rows), "columns": self.dtypes,
            "label_column": self.label, "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle,
        }

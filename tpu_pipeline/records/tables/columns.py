"""The columns `convert --from parquet|hf` converts, checked against the files' schemas, and one piece's
rows encoded as tf.Examples.

- `--text_field` (strings, tokenized as `--from text` does; byte-level text as one array) or
  `--ids_field` (a list of ints per row) → `tokens`;
- `--image_field` (datasets' Image: a struct of `bytes` and `path`; or binary) → `image` (the original
  bytes, never re-encoded), `height` and `width` (from the header: records/image_header.py);
- `--label_field` (ints, or strings made class ids) → `label`, and `label_name` when the classes have
  names (`--class_names`, datasets' ClassLabel, or the sorted distinct strings);
- `--keep_fields` → scalar columns under their own names (ints and bools int64, floats float32,
  strings and bytes string).

A nested column where a scalar is expected is refused before anything is written, naming the file and
its type. A null value, an image held only by its path, bytes that are no image, an id outside the
vocabulary or a label outside the classes is an ItemError naming file, row group and row.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.tokenizer import ByteTokenizer
from tpu_pipeline.records.convert_input import Encoded, ItemError
from tpu_pipeline.records.examples import feature, serialize, spec
from tpu_pipeline.records.image_header import NotAnImage, image_size
from tpu_pipeline.records.tables.files import TableFiles, is_binary, is_int, is_list, is_string, scalar_dtype
from tpu_pipeline.records.tables.hub_layout import class_names_of, hf_features_of_schema
from tpu_pipeline.records.token_records import FEATURE, TokenRecords

OUT_NAMES = ("tokens", "image", "height", "width", "label", "label_name")
Result = tuple[Union[Encoded, bytes, None], Optional[ItemError]]


class Columns:
    """The columns to convert, by role; `encode` turns one piece's table into each row's result."""

    def __init__(self, text_field: Optional[str], ids_field: Optional[str], image_field: Optional[str],
                 label_field: Optional[str], keep_fields: Sequence[str], records: Optional[TokenRecords]) -> None:
        self.text_field, self.ids_field, self.image_field, self.label_field = text_field, ids_field, image_field, label_field
        self.keep_fields = list(keep_fields)
        self.records = records
        self.names = [c for c in (text_field, ids_field, image_field, label_field, *self.keep_fields) if c]
        self.class_names: Optional[list[str]] = None
        self.label_ids: Optional[dict[str, int]] = None
        self.label_is_string = False
        self.kept: dict[str, str] = {}  # keep field → its tf.Example dtype

    # --- before anything is written -------------------------------------------------------------

    def check(self, files: TableFiles) -> None:
        """Every file has every named column, of one type the converter takes (one line naming file and column)."""
        for entry in files.files:
            missing = [c for c in self.names if c not in entry.schema.names]
            if missing:
                raise ConfigError(f"{files.kind}: {entry.relative} has no column(s) {missing}; its columns: "
                                  f"{', '.join(f'{n} ({t})' for n, t in zip(entry.schema.names, entry.schema.types))}")
        first = files[0]
        for column in self.names:
            dtype = first.schema.field(column).type
            for entry in files.files[1:]:
                other = entry.schema.field(column).type
                if other != dtype and not (is_string(other) and is_string(dtype)) and not (is_int(other) and is_int(dtype)):
                    raise DataError(f"{files.kind}: column {column!r} is {dtype} in {first.relative} but {other} in "
                                    f"{entry.relative}; convert files of one schema")
            self._check_type(column, dtype, first.relative)
        self.label_is_string = bool(self.label_field) and scalar_dtype(files.field(self.label_field)) == "string"
        self.kept = {name: scalar_dtype(files.field(name)) for name in self.keep_fields}

    def _check_type(self, column: str, dtype: pa.DataType, where: str) -> None:
        plain = dtype.value_type if pa.types.is_dictionary(dtype) else dtype
        if column == self.text_field and not is_string(plain):
            hint = " (tokens already? use --ids_field)" if is_list(plain) else ""
            raise ConfigError(f"--text_field {column}: column {column!r} of {where} is {dtype}, not strings{hint}")
        if column == self.ids_field and not (is_list(plain) and is_int(plain.value_type)):
            raise ConfigError(f"--ids_field {column}: column {column!r} of {where} is {dtype}, not a list of "
                              "integers per row (text? use --text_field)")
        if column == self.image_field:
            is_struct = (pa.types.is_struct(plain) and plain.get_field_index("bytes") >= 0
                         and is_binary(plain.field("bytes").type))
            if not (is_struct or is_binary(plain)):
                raise ConfigError(f"--image_field {column}: column {column!r} of {where} is {dtype}; it must hold "
                                  "encoded images: datasets' Image (a struct of bytes and path) or binary")
        if column == self.label_field and scalar_dtype(dtype) not in ("int64", "string"):
            raise ConfigError(f"--label_field {column}: column {column!r} of {where} is {dtype}; labels must be "
                              "integers (class ids) or strings (class names)")
        if column in self.keep_fields and scalar_dtype(dtype) is None:
            raise ConfigError(f"--keep_fields {column}: column {column!r} of {where} is {dtype}, a nested type; only "
                              "scalar columns (numbers, strings, bytes) are kept: leave it out of --keep_fields")

    def find_class_names(self, files: TableFiles, given: Optional[Sequence[str]], hf_features: Optional[dict]) -> None:
        """--class_names, else datasets' ClassLabel names, else the sorted distinct string labels."""
        if not self.label_field:
            if given:
                raise ConfigError("--class_names: only with --label_field")
            return
        names: Optional[list[str]] = None
        if given:
            names = list(given)
            if len(set(names)) != len(names):
                raise ConfigError(f"--class_names repeat: {names}")
            if self.label_is_string:
                unknown = sorted(self._distinct_labels(files) - set(names))
                if unknown:
                    raise DataError(f"{files.kind}: label(s) {unknown[:10]} of column {self.label_field!r} are not in "
                                    f"--class_names {names}")
        elif self.label_is_string:
            names = sorted(self._distinct_labels(files))
        else:
            names = class_names_of(hf_features or hf_features_of_schema(files.schema_metadata()), self.label_field)
        self.class_names = names
        if names and self.label_is_string:
            self.label_ids = {name: i for i, name in enumerate(names)}

    def _distinct_labels(self, files: TableFiles) -> set[str]:
        """Every string label of the dataset (the label column only is read, piece by piece)."""
        found: set = set()
        for number, entry in enumerate(files.files):
            for piece in range(len(entry.pieces)):
                found.update(v for v in files.read(number, piece, [self.label_field]).column(0).unique().to_pylist()
                             if v is not None)
        return {v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in found}

    def features(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        if self.records is not None:
            result[FEATURE] = {"dtype": "int64", "kind": "ragged"}
        if self.image_field:
            result.update(image=spec("string"), height=spec("int64"), width=spec("int64"))
        if self.label_field:
            result["label"] = spec("int64")
            if self.class_names:
                result["label_name"] = spec("string")
        result.update({name: spec(dtype) for name, dtype in self.kept.items()})
        return result

    # --- one piece --------------------------------------------------------------------------------

    def encode(self, table: pa.Table, where: list[str]) -> list[Result]:
        """Each row's (record, None) or (None, ItemError); `where[i]` names row i (file, row group, row)."""
        n = table.num_rows
        errors: dict[int, str] = {}
        columns = {}
        for name in self.names:
            column = table.column(name).combine_chunks()
            if pa.types.is_dictionary(column.type):
                column = column.dictionary_decode()
            columns[name] = column
            if column.null_count:
                for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
                    errors.setdefault(row, f"column {name!r} is null; fill it")
        extras: list[dict[str, tf.train.Feature]] = [{} for _ in range(n)]
        if self.image_field:
            self._images(columns[self.image_field], errors, extras)
        if self.label_field:
            self._labels(columns[self.label_field], errors, extras)
        for name, dtype in self.kept.items():
            for row, value in enumerate(columns[name].to_pylist()):
                if row not in errors:
                    extras[row][name] = feature(value, dtype)
        if self.ids_field:
            self._check_ids(columns[self.ids_field], errors)
        out: list[Result] = [(None, ItemError(where[row], errors[row])) if row in errors else (None, None)
                             for row in range(n)]
        good = np.array([row for row in range(n) if row not in errors], np.int64)
        if self.records is not None:
            encoded = self._tokens(columns[self.text_field or self.ids_field], good, [extras[r] for r in good.tolist()])
            for row, value in zip(good.tolist(), encoded):
                out[row] = (value, None)
        else:
            for row in good.tolist():
                out[row] = (serialize(extras[row]), None)
        return out

    def _images(self, column: pa.Array, errors: dict[int, str], extras: list[dict]) -> None:
        paths: list[Optional[str]] = [None] * len(column)
        data = column
        if pa.types.is_struct(column.type):
            data = column.field("bytes")
            if column.type.get_field_index("path") >= 0:
                paths = column.field("path").to_pylist()
        for row, value in enumerate(data.to_pylist()):
            if row in errors:
                continue
            if value is None:
                at = f" (path {paths[row]!r})" if paths[row] else ""
                errors[row] = (f"column {self.image_field!r} holds no image bytes{at}: the image lives outside the "
                               "file; save the dataset with its images embedded (datasets' push_to_hub and "
                               f"save_to_disk embed them)")
                continue
            try:
                _, height, width = image_size(value)
            except NotAnImage as error:
                errors[row] = f"column {self.image_field!r}: {error}"
                continue
            extras[row].update(image=feature(value, "string"), height=feature(height, "int64"),
                               width=feature(width, "int64"))

    def _labels(self, column: pa.Array, errors: dict[int, str], extras: list[dict]) -> None:
        names = self.class_names
        for row, value in enumerate(column.to_pylist()):
            if row in errors:
                continue
            if self.label_ids is not None:
                label = self.label_ids[value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)]
            else:
                label = int(value)
                if label < 0 or (names and label >= len(names)):
                    unlabeled = (" (-1 is datasets' mark of an unlabeled row, as in many test splits: leave that "
                                 "split out with --splits, or convert without --label_field)" if label == -1 else "")
                    bound = f"0..{len(names) - 1}" if names else "0 or more"
                    errors[row] = f"label {label} in column {self.label_field!r} is not a class id in {bound}{unlabeled}"
                    continue
            extras[row]["label"] = feature(label, "int64")
            if names:
                extras[row]["label_name"] = feature(names[label], "string")

    def _check_ids(self, column: pa.Array, errors: dict[int, str]) -> None:
        size = self.records.tokenizer.vocab_size
        column = column if pa.types.is_large_list(column.type) else column.cast(pa.large_list(pa.int64()))
        offsets = column.offsets.to_numpy()
        values = column.values
        if values.null_count:
            for position in np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False)).tolist():
                row = int(np.searchsorted(offsets, position, side="right") - 1)
                errors.setdefault(row, f"column {self.ids_field!r} holds a null id (position {position - offsets[row]}); "
                                       "fix it")
        ids = values.fill_null(0).to_numpy()
        for position in np.flatnonzero((ids < 0) | (ids >= size)).tolist():
            row = int(np.searchsorted(offsets, position, side="right") - 1)
            errors.setdefault(row, f"id {int(ids[position])} (position {position - offsets[row]}) is outside "
                                   f"[0, {size}) (--vocab_size {size})")

    def _tokens(self, column: pa.Array, good: np.ndarray, extras: list[dict]) -> list[Encoded]:
        """The `tokens` records of the good rows (+ their other features, written into each record)."""
        column = column.take(pa.array(good, pa.int64())) if len(good) != len(column) else column
        others = [tf.train.Features(feature=e).SerializeToString() if e else b"" for e in extras]
        extra = others if any(others) else None
        if self.ids_field:
            column = column if pa.types.is_large_list(column.type) else column.cast(pa.large_list(pa.int64()))
            offsets = column.offsets.to_numpy()
            values = column.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
            return self.records.encode_flat(values, offsets - offsets[0], None, extra)
        column = column if pa.types.is_large_string(column.type) else column.cast(pa.large_string())
        if isinstance(self.records.tokenizer, ByteTokenizer) and not self.records.tokenizer.added_tokens:  # the UTF-8 buffer as it is: one array op
            offsets = np.frombuffer(column.buffers()[1], np.int64)[column.offset:column.offset + len(column) + 1]
            data = column.buffers()[2]
            data = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
            return self.records.encode_utf8(data, offsets, extra)
        return self.records.encode_many(column.to_pylist(), extra)

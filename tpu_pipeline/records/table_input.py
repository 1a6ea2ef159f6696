"""Parquet files (the Hugging Face hub's layout) and `datasets.save_to_disk` folders → TFRecord shards:
`convert --from parquet` and `convert --from hf`.

The unit of work is a *piece*: one Parquet row group, or one record batch of an Arrow file. Row counts
and sizes come from the files' metadata (Parquet footers; Arrow batch headers, memory-mapped), so the
plan is made without reading data. A worker task reads one piece (only the columns it needs, with
pyarrow) and encodes all its rows at once; tasks run in parallel over files and pieces.

Order (`shuffle`, the default): the pieces of a split are put in a seeded random order and grouped
into *windows* of consecutive pieces holding about `shuffle_window_mb` of data; within a window the
rows are shuffled together (seeded by the seed, the split and the window's number). So a shard mixes
rows of many row groups, memory holds about two windows and one piece per worker (never the dataset),
and "the row at position i" is a pure function of a few integers: a resumed conversion starts at a
shard's first position by reading only the window that holds it. `shuffle=False` writes the rows in
file order.

A split cut by fractions (`--splits train=0.9,validation=0.1`, one split in the layout) takes its share
of every piece (a seeded choice of rows, carried-over rounding making the totals exact), so each split
draws from the whole dataset; each split reads the files once.

Columns → features: `--text_field` (a string column, tokenized as `--from text` does) or `--ids_field`
(a list of ints) → `tokens`; `--image_field` (datasets' Image: a struct of `bytes` and `path`, or
plain bytes) → `image` (the original bytes), `height`, `width` (from the header); `--label_field`
(ints, or strings made class ids) → `label` (+ `label_name` when the classes have names, from
datasets' ClassLabel, `--class_names` or the sorted strings); `--keep_fields` → scalar columns as
they are. A null value, or an image held only by path, is an ItemError naming the file, row group and
row (the row counted from the file's start).
"""
from __future__ import annotations

import bisect
import collections
import concurrent.futures
import hashlib
import json
import math
import os
import threading
import zlib
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.tokenizer import ByteTokenizer, IdsTokenizer, Tokenizer, load_tokenizer
from tpu_pipeline.records.convert_input import Encoded, ItemError
from tpu_pipeline.records.examples import feature, serialize, spec
from tpu_pipeline.records.hub_layout import (ARROW, Layout, class_names_of, find_hf, find_parquet,
                                             hf_features_of_schema)
from tpu_pipeline.records.image_header import NotAnImage, image_size
from tpu_pipeline.records.parallel import ordered_map
from tpu_pipeline.records.sharding import RECORD_OVERHEAD, parse_splits, split_fractions
from tpu_pipeline.records.token_records import FEATURE, MAX_RECORD_TOKENS, TokenRecords
from tpu_pipeline.system import local_path

SHUFFLE_WINDOW_MB = 256  # rows are shuffled within windows of about this much data (--shuffle_window_mb)
_OUT_NAMES = ("tokens", "image", "height", "width", "label", "label_name")
Result = tuple[Union[Encoded, bytes, None], Optional[ItemError]]


class _File:
    def __init__(self, root: str, relative: str) -> None:
        self.relative = relative
        self.path = relative if "://" in relative or os.path.isabs(relative) else tf.io.gfile.join(root, relative)
        stat = tf.io.gfile.stat(self.path)
        self.size, self.mtime = int(stat.length), int(stat.mtime_nsec)
        self.schema: Optional[pa.Schema] = None
        self.pieces: list[tuple[int, int, int]] = []  # (rows, bytes of the needed columns, first row in the file)


def _int(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_boolean(dtype)


def _string(dtype: pa.DataType) -> bool:
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or getattr(pa.types, "is_string_view", lambda _: False)(dtype)


def _binary(dtype: pa.DataType) -> bool:
    return pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or getattr(pa.types, "is_binary_view", lambda _: False)(dtype)


def _list(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)


def _scalar_dtype(dtype: pa.DataType) -> Optional[str]:
    """The tf.Example dtype of a scalar column (None: not a scalar)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if _int(dtype):
        return "int64"
    if pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "float32"
    if _string(dtype) or _binary(dtype):
        return "string"
    return None


def _seed(*parts: Union[int, str]) -> list[int]:
    return [zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in parts]


class TableSource:
    """A Parquet dataset or a save_to_disk folder as a ConvertSource whose tasks are whole pieces."""

    def __init__(
        self, path: str, *, kind: str = "parquet", config: Optional[str] = None, splits: Optional[str] = None,
        seed: int = 0, shuffle: bool = True, text_field: Optional[str] = None, ids_field: Optional[str] = None,
        vocab_size: Optional[int] = None, tokenizer: Union[str, Tokenizer] = "bytes",
        max_record_tokens: int = MAX_RECORD_TOKENS, image_field: Optional[str] = None,
        label_field: Optional[str] = None, keep_fields: Sequence[str] = (), class_names: Optional[Sequence[str]] = None,
        shuffle_window_mb: float = SHUFFLE_WINDOW_MB,
    ) -> None:
        self.kind = kind
        self._check_flags(text_field, ids_field, vocab_size, tokenizer, image_field, label_field, keep_fields,
                          max_record_tokens, shuffle_window_mb)
        self.text_field, self.ids_field, self.image_field, self.label_field = text_field, ids_field, image_field, label_field
        self.keep_fields = list(dict.fromkeys(keep_fields))
        self.seed, self.shuffle, self.shuffle_window_mb = seed, shuffle, float(shuffle_window_mb)
        self.max_record_tokens = int(max_record_tokens)
        self.tokenizer: Optional[Tokenizer] = None
        self.records: Optional[TokenRecords] = None
        if text_field or ids_field:
            self.tokenizer = (IdsTokenizer(int(vocab_size)) if ids_field else
                              load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer)
            self.records = TokenRecords(self.tokenizer, self.max_record_tokens)
        given = path
        path = local_path(path, absolute=True)
        self.layout: Layout = (find_hf if kind == "hf" else find_parquet)(path, config)
        self.root = self.layout.root
        if self.layout.format == ARROW and "://" in self.root:
            raise ConfigError(f"--from hf: {given} is in a bucket; save_to_disk folders are read memory-mapped from a "
                              "local disk: copy it there first (gsutil -m cp -r), or convert the dataset's Parquet files")
        self.name = os.path.basename(self.root.rstrip("/")) or "dataset"
        self.columns = [c for c in (text_field, ids_field, image_field, label_field, *self.keep_fields) if c]
        relatives = list(dict.fromkeys(f for files in self.layout.splits.values() for f in files))
        self.files = [_File(self.root, r) for r in relatives]
        self._file_index = {f.relative: i for i, f in enumerate(self.files)}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._arrow_cache: collections.OrderedDict[int, list[pa.RecordBatch]] = collections.OrderedDict()
        for index in range(len(self.files)):
            self._read_footer(index)
        self._check_columns()
        self._class_names = self._find_class_names(class_names)
        self._label_ids = ({name: i for i, name in enumerate(self._class_names)}
                           if self._class_names and self._label_is_string else None)
        self._plan_splits(splits)

    # --- flags, files and columns --------------------------------------------------------------

    @staticmethod
    def _check_flags(text_field, ids_field, vocab_size, tokenizer, image_field, label_field, keep_fields,
                     max_record_tokens, shuffle_window_mb) -> None:
        if text_field and ids_field:
            raise ConfigError("--text_field and --ids_field: give one of them (text to tokenize, or ids as they are)")
        if ids_field and vocab_size is None:
            raise ConfigError("--ids_field needs --vocab_size N: every id must lie in [0, N)")
        if vocab_size is not None and not ids_field:
            raise ConfigError("--vocab_size: only with --ids_field (a tokenizer brings its own vocabulary)")
        if vocab_size is not None and vocab_size < 1:
            raise ConfigError(f"--vocab_size must be >= 1 (given: {vocab_size})")
        if ids_field and tokenizer != "bytes":
            raise ConfigError("--tokenizer: not with --ids_field, whose ids are already tokens")
        if not (text_field or ids_field) and tokenizer != "bytes":
            raise ConfigError("--tokenizer: only with --text_field (the column to tokenize)")
        if max_record_tokens < 0:
            raise ConfigError(f"--max_record_tokens must be >= 0 (0: one record per document; given: {max_record_tokens})")
        if not shuffle_window_mb > 0:
            raise ConfigError(f"--shuffle_window_mb must be > 0 (given: {shuffle_window_mb})")
        if not (text_field or ids_field or image_field or label_field or keep_fields):
            raise ConfigError("--from parquet/hf: name the columns to convert: --text_field (or --ids_field) for text, "
                              "--image_field [--label_field] for images, --keep_fields for other columns")
        used = [c for c in (text_field, ids_field, image_field, label_field) if c]
        twice = sorted({c for c in [*used, *keep_fields] if [*used, *keep_fields].count(c) > 1})
        if twice:
            raise ConfigError(f"--keep_fields: {twice} already converted by --text_field/--ids_field/--image_field/"
                              "--label_field; leave them out of --keep_fields")
        clash = sorted(set(keep_fields) & set(_OUT_NAMES))
        if clash:
            raise ConfigError(f"--keep_fields: {clash} would clash with the features this converter writes "
                              f"({', '.join(_OUT_NAMES)}); rename the column(s) first")

    def _where(self, file: int, piece: int, row: Optional[int] = None) -> str:
        unit = "record batch" if self.layout.format == ARROW else "row group"
        return f"{self.files[file].relative}: {unit} {piece}" + ("" if row is None else f", row {row}")

    def _read_footer(self, index: int) -> None:
        """The file's schema and its pieces' rows and sizes, from its metadata (no data read)."""
        entry = self.files[index]
        try:
            if self.layout.format == ARROW:
                batches = self._arrow_batches(index)
                entry.schema = batches[0].schema if batches else self._arrow_schema(index)
                sizes = [(b.num_rows, b.get_total_buffer_size()) for b in batches]
            else:
                with self._open_parquet(entry.path) as handle:
                    meta = handle.metadata
                    entry.schema = handle.schema_arrow
                    names = [meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns)]
                    sizes = []
                    for g in range(meta.num_row_groups):
                        group = meta.row_group(g)
                        wanted = sum(group.column(i).total_uncompressed_size for i in range(group.num_columns)
                                     if names[i] in self.columns)
                        sizes.append((group.num_rows, wanted))
        except (pa.ArrowException, OSError, tf.errors.OpError) as error:
            what = "an Arrow file (IPC stream)" if self.layout.format == ARROW else "a Parquet file"
            raise DataError(f"{self.kind}: {entry.relative} is not {what} pyarrow reads "
                            f"({str(error).splitlines()[0][:200]}); copy it again or leave it out") from None
        first = 0
        for rows, size in sizes:
            entry.pieces.append((rows, size, first))
            first += rows

    def _open_parquet(self, path: str) -> pq.ParquetFile:
        source = tf.io.gfile.GFile(path, "rb") if "://" in path else path
        return pq.ParquetFile(source, memory_map=False)

    def _arrow_schema(self, index: int) -> pa.Schema:
        with pa.memory_map(self.files[index].path) as handle:
            return _arrow_reader(handle).schema

    def _arrow_batches(self, index: int) -> list[pa.RecordBatch]:
        """An Arrow file's record batches, memory-mapped (zero-copy); a few files kept open."""
        with self._lock:
            cached = self._arrow_cache.pop(index, None)
            if cached is None:
                handle = pa.memory_map(self.files[index].path)
                cached = list(_arrow_reader(handle))
            self._arrow_cache[index] = cached
            while len(self._arrow_cache) > 8:
                self._arrow_cache.popitem(last=False)
            return cached

    def _check_columns(self) -> None:
        """Every file has every named column, of one type the converter takes (one line naming file and column)."""
        for entry in self.files:
            names = entry.schema.names
            missing = [c for c in self.columns if c not in names]
            if missing:
                raise ConfigError(f"{self.kind}: {entry.relative} has no column(s) {missing}; its columns: "
                                  f"{', '.join(f'{n} ({t})' for n, t in zip(names, entry.schema.types))}")
        first = self.files[0]
        for column in self.columns:
            dtype = first.schema.field(column).type
            for entry in self.files[1:]:
                other = entry.schema.field(column).type
                if other != dtype and not (_string(other) and _string(dtype)) and not (_int(other) and _int(dtype)):
                    raise DataError(f"{self.kind}: column {column!r} is {dtype} in {first.relative} but {other} in "
                                    f"{entry.relative}; convert files of one schema")
            self._check_type(column, dtype, first.relative)
        self._label_is_string = bool(self.label_field) and _scalar_dtype(first.schema.field(self.label_field).type) == "string"

    def _check_type(self, column: str, dtype: pa.DataType, where: str) -> None:
        plain = dtype.value_type if pa.types.is_dictionary(dtype) else dtype
        if column == self.text_field and not _string(plain):
            hint = " (tokens already? use --ids_field)" if _list(plain) else ""
            raise ConfigError(f"--text_field {column}: column {column!r} of {where} is {dtype}, not strings{hint}")
        if column == self.ids_field and not (_list(plain) and _int(plain.value_type)):
            raise ConfigError(f"--ids_field {column}: column {column!r} of {where} is {dtype}, not a list of "
                              "integers per row (text? use --text_field)")
        if column == self.image_field:
            is_struct = pa.types.is_struct(plain) and plain.get_field_index("bytes") >= 0 and \
                _binary(plain.field("bytes").type)
            if not (is_struct or _binary(plain)):
                raise ConfigError(f"--image_field {column}: column {column!r} of {where} is {dtype}; it must hold "
                                  "encoded images: datasets' Image (a struct of bytes and path) or binary")
        if column == self.label_field and _scalar_dtype(dtype) not in ("int64", "string"):
            raise ConfigError(f"--label_field {column}: column {column!r} of {where} is {dtype}; labels must be "
                              "integers (class ids) or strings (class names)")
        if column in self.keep_fields and _scalar_dtype(dtype) is None:
            raise ConfigError(f"--keep_fields {column}: column {column!r} of {where} is {dtype}, a nested type; only "
                              "scalar columns (numbers, strings, bytes) are kept: leave it out of --keep_fields")

    def _find_class_names(self, given: Optional[Sequence[str]]) -> Optional[list[str]]:
        if not self.label_field:
            if given:
                raise ConfigError("--class_names: only with --label_field")
            return None
        if given:
            names = list(given)
            if len(set(names)) != len(names):
                raise ConfigError(f"--class_names repeat: {names}")
            if self._label_is_string:
                found = self._distinct_labels()
                unknown = sorted(found - set(names))
                if unknown:
                    raise DataError(f"{self.kind}: label(s) {unknown[:10]} of column {self.label_field!r} are not in "
                                    f"--class_names {names}")
            return names
        if self._label_is_string:
            return sorted(self._distinct_labels())
        hf = self.layout.hf_features or hf_features_of_schema(self.files[0].schema.metadata)
        return class_names_of(hf, self.label_field)

    def _distinct_labels(self) -> set[str]:
        """Every string label of the dataset (the label column only is read, file by file)."""
        found: set[str] = set()
        for index, entry in enumerate(self.files):
            for piece in range(len(entry.pieces)):
                column = self._read(index, piece, [self.label_field]).column(0)
                found.update(v for v in column.unique().to_pylist() if v is not None)
        return {v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in found}

    # --- splits and order -----------------------------------------------------------------------

    def _plan_splits(self, text: Optional[str]) -> None:
        """Output split → (its layout split, the [low, high) fraction of it); then per split its pieces."""
        layout = self.layout.splits
        self.fractions: Optional[dict[str, float]] = None
        chosen: dict[str, tuple[str, float, float]] = {}
        if not text:
            chosen = {name: (name, 0.0, 1.0) for name in layout}
        else:
            parsed = parse_splits(text)
            numeric = any(v is not None and _is_number(v) for _, v in parsed)
            if numeric or (len(parsed) == 1 and parsed[0][1] is None and len(layout) == 1):
                if len(layout) != 1:
                    raise ConfigError(f"--splits {text}: fractions cut a dataset of one split, and {self.root} has "
                                      f"{len(layout)} ({', '.join(layout)}); pick or rename them instead, e.g. "
                                      "--splits train,validation=test")
                self.fractions = split_fractions(text)
                source, low = next(iter(layout)), 0.0
                for name, fraction in self.fractions.items():
                    chosen[name] = (source, low, low + fraction)
                    low += fraction
                last = next(reversed(chosen))
                chosen[last] = (chosen[last][0], chosen[last][1], 1.0)
            else:
                for name, value in parsed:
                    source = value or name
                    if source not in layout:
                        raise ConfigError(f"--splits: {self.root} has no split {source!r}; its splits: {', '.join(layout)}")
                    chosen[name] = (source, 0.0, 1.0)
        self._chosen = chosen
        self._pieces: dict[str, list[tuple[int, int, int]]] = {}  # split → (file, piece, rows in this split)
        for name, (source, low, high) in chosen.items():
            pieces, offset = [], 0
            total = sum(self.files[self._file_index[f]].pieces[p][0] for f in layout[source]
                        for p in range(len(self.files[self._file_index[f]].pieces)))
            for relative in layout[source]:
                index = self._file_index[relative]
                for piece, (rows, _, _) in enumerate(self.files[index].pieces):
                    count = (_share(high, offset + rows) - _share(low, offset + rows)) - (_share(high, offset) - _share(low, offset))
                    offset += rows
                    if count:
                        pieces.append((index, piece, count))
            if not pieces:
                raise DataError(f"--splits: split {name!r} gets no row out of {total}; give it a larger fraction "
                                "or convert more data")
            self._pieces[name] = pieces
        self._windows: dict[str, tuple[list[list[int]], list[int]]] = {}

    def _order(self, split: str) -> tuple[list[list[int]], list[int]]:
        """The split's windows (lists of indices into its pieces, in write order) and their first positions."""
        if split in self._windows:
            return self._windows[split]
        pieces = self._pieces[split]
        order = np.arange(len(pieces))
        if self.shuffle:
            order = np.random.default_rng(_seed(self.seed, split, "pieces")).permutation(len(pieces))
        sizes = [self._piece_bytes(*pieces[i][:2]) for i in order.tolist()]
        mean = max(1.0, sum(sizes) / max(1, len(sizes)))
        per_window = max(1, int(self.shuffle_window_mb * 2**20 // mean)) if self.shuffle else 1
        windows = [order[k:k + per_window].tolist() for k in range(0, len(order), per_window)]
        starts, position = [], 0
        for window in windows:
            starts.append(position)
            position += sum(pieces[i][2] for i in window)
        self._windows[split] = (windows, starts)
        return windows, starts

    def _piece_bytes(self, file: int, piece: int) -> int:
        return self.files[file].pieces[piece][1]

    def _rows(self, split: str, file: int, piece: int) -> Optional[np.ndarray]:
        """The rows of a piece that belong to `split`, in their order (None: all, in order)."""
        source, low, high = self._chosen[split]
        rows, _, first = self.files[file].pieces[piece]
        if low == 0.0 and high == 1.0:
            return None
        # The piece's rows in a seeded order; each split of the cut takes its consecutive share of it.
        order = (np.random.default_rng(_seed(self.seed, self.files[file].relative, piece, "cut")).permutation(rows)
                 if self.shuffle else np.arange(rows))
        offset = self._layout_offset(source, file) + first
        begin = (_share(low, offset + rows) - _share(low, offset))
        end = (_share(high, offset + rows) - _share(high, offset))
        return order[begin:end]

    def _layout_offset(self, source: str, file: int) -> int:
        offset = 0
        for relative in self.layout.splits[source]:
            index = self._file_index[relative]
            if index == file:
                return offset
            offset += sum(p[0] for p in self.files[index].pieces)
        raise KeyError(file)

    # --- the ConvertSource interface ------------------------------------------------------------

    def split_sizes(self) -> dict[str, int]:
        return {name: sum(p[2] for p in pieces) for name, pieces in self._pieces.items()}

    def estimate_bytes(self, split: str) -> int:
        total = 0
        for file, piece, count in self._pieces[split]:
            rows, size, _ = self.files[file].pieces[piece]
            total += size * count / max(1, rows) + count * (RECORD_OVERHEAD + 24)
        if self.text_field and self.tokenizer is not None and not isinstance(self.tokenizer, ByteTokenizer):
            total *= 0.5  # subword ids: fewer bytes than the text
        return int(total)

    def items(self, split: str, start: int) -> Iterator[Any]:
        """Not used: this source encodes whole pieces (encode_stream); kept for the protocol."""
        raise NotImplementedError("TableSource encodes whole pieces: the converter calls encode_stream")

    def encode(self, item: Any) -> bytes:
        raise NotImplementedError("TableSource encodes whole pieces: the converter calls encode_stream")

    def encode_stream(self, split: str, start: int, executor: concurrent.futures.Executor,
                      workers: int) -> Iterator[Result]:
        """(record, error) of each position of `split` from `start`, in write order: one task per piece,
        in parallel; a window's rows shuffled together once all its pieces are back."""
        windows, starts = self._order(split)
        pieces = self._pieces[split]
        first = max(0, bisect.bisect_right(starts, start) - 1)
        tasks = ((w, i) for w in range(first, len(windows)) for i in windows[w])
        ahead = max(len(windows[0]), 1) + max(1, workers)
        results = ordered_map(lambda task: self._encode_piece(split, *pieces[task[1]][:2]), tasks, executor, ahead)
        try:
            for w in range(first, len(windows)):
                rows: list[Result] = []
                for _ in windows[w]:
                    rows.extend(next(results))
                order = (np.random.default_rng(_seed(self.seed, split, "window", w)).permutation(len(rows)).tolist()
                         if self.shuffle else range(len(rows)))
                skip = start - starts[w] if w == first else 0
                for position, row in enumerate(order):
                    if position >= skip:
                        yield rows[row]
        finally:
            results.close()

    # --- reading and encoding one piece ---------------------------------------------------------

    def _read(self, file: int, piece: int, columns: list[str]) -> pa.Table:
        if self.layout.format == ARROW:
            batch = self._arrow_batches(file)[piece]
            return pa.Table.from_batches([batch.select(columns)])
        cache = getattr(self._local, "files", None)
        if cache is None:
            cache = self._local.files = collections.OrderedDict()
        handle = cache.pop(file, None) or self._open_parquet(self.files[file].path)
        cache[file] = handle
        while len(cache) > 4:
            cache.popitem(last=False)[1].close()
        return handle.read_row_group(piece, columns=columns, use_threads=False)

    def _encode_piece(self, split: str, file: int, piece: int) -> list[Result]:
        try:
            table = self._read(file, piece, self.columns)
        except (pa.ArrowException, OSError, tf.errors.OpError) as error:
            raise DataError(f"{self.kind}: cannot read {self._where(file, piece)} ({str(error).splitlines()[0][:200]}); "
                            "copy the file again, or leave it out") from None
        rows = self._rows(split, file, piece)
        first = self.files[file].pieces[piece][2]
        numbers = np.arange(table.num_rows) if rows is None else rows
        if rows is not None:
            table = table.take(pa.array(rows, pa.int64()))
        n = table.num_rows
        errors: dict[int, str] = {}
        columns = {name: table.column(name).combine_chunks() for name in self.columns}
        for name in self.columns:
            column = columns[name]
            if pa.types.is_dictionary(column.type):
                columns[name] = column = column.dictionary_decode()
            if column.null_count:
                for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
                    errors.setdefault(row, f"column {name!r} is null; fill it, or pass --on_error=skip to leave such rows out")
        extras: list[dict[str, tf.train.Feature]] = [{} for _ in range(n)]
        if self.image_field:
            self._images(columns[self.image_field], errors, extras)
        if self.label_field:
            self._labels(columns[self.label_field], errors, extras)
        for name in self.keep_fields:
            dtype = _scalar_dtype(columns[name].type)
            for row, value in enumerate(columns[name].to_pylist()):
                if row not in errors:
                    extras[row][name] = feature(value, dtype)
        if self.ids_field:
            self._check_ids(columns[self.ids_field], errors)
        good = np.array([row for row in range(n) if row not in errors], np.int64)
        out: list[Result] = [(None, ItemError(self._where(file, piece, first + int(numbers[row])), errors[row]))
                             if row in errors else (None, None) for row in range(n)]
        if self.records is not None:
            encoded = self._tokens(columns[self.text_field or self.ids_field], good, [extras[r] for r in good.tolist()])
            for row, value in zip(good.tolist(), encoded):
                out[row] = (value, None)
        else:
            for row in good.tolist():
                out[row] = (serialize(extras[row]), None)
        return out

    def _images(self, column: pa.Array, errors: dict[int, str], extras: list[dict]) -> None:
        if pa.types.is_struct(column.type):
            data = column.field("bytes")
            paths = column.field("path").to_pylist() if column.type.get_field_index("path") >= 0 else [None] * len(column)
        else:
            data, paths = column, [None] * len(column)
        for row, value in enumerate(data.to_pylist()):
            if row in errors:
                continue
            if value is None:
                where = f" (path {paths[row]!r})" if paths[row] else ""
                errors[row] = (f"column {self.image_field!r} holds no image bytes{where}: the image lives outside the "
                               "file; load the dataset with datasets and save it with its images embedded "
                               "(Dataset.push_to_hub and save_to_disk embed them), or pass --on_error=skip")
                continue
            try:
                _, height, width = image_size(value)
            except NotAnImage as error:
                errors[row] = f"column {self.image_field!r}: {error}"
                continue
            extras[row].update(image=feature(value, "string"), height=feature(height, "int64"),
                               width=feature(width, "int64"))

    def _labels(self, column: pa.Array, errors: dict[int, str], extras: list[dict]) -> None:
        names = self._class_names
        for row, value in enumerate(column.to_pylist()):
            if row in errors:
                continue
            if self._label_ids is not None:
                value = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
                label = self._label_ids[value]
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
        size = self.tokenizer.vocab_size
        column = column.cast(pa.large_list(pa.int64())) if not pa.types.is_large_list(column.type) else column
        offsets = column.offsets.to_numpy()
        values = column.values
        if values.null_count:
            nulls = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
            for position in nulls.tolist():
                row = int(np.searchsorted(offsets, position, side="right") - 1)
                errors.setdefault(row, f"column {self.ids_field!r} holds a null id (position {position - offsets[row]})")
        ids = values.fill_null(0).to_numpy()
        bad = np.flatnonzero((ids < 0) | (ids >= size))
        for position in bad.tolist():
            row = int(np.searchsorted(offsets, position, side="right") - 1)
            errors.setdefault(row, f"id {int(ids[position])} (position {position - offsets[row]}) is outside "
                                   f"[0, {size}) (--vocab_size {size})")

    def _tokens(self, column: pa.Array, good: np.ndarray, extras: list[dict]) -> list[Encoded]:
        """The `tokens` records of the good rows (+ their other features)."""
        column = column.take(pa.array(good)) if len(good) != len(column) else column
        others = [tf.train.Features(feature=e).SerializeToString() if e else b"" for e in extras]
        extra = others if any(others) else None
        if self.ids_field:
            column = column.cast(pa.large_list(pa.int64())) if not pa.types.is_large_list(column.type) else column
            offsets = column.offsets.to_numpy()
            values = column.values.to_numpy()[offsets[0]:offsets[-1]]
            return self.records.encode_flat(values, offsets - offsets[0], None, extra)
        column = column.cast(pa.large_string()) if not pa.types.is_large_string(column.type) else column
        if isinstance(self.tokenizer, ByteTokenizer):
            offsets = np.frombuffer(column.buffers()[1], np.int64)[column.offset:column.offset + len(column) + 1]
            data = column.buffers()[2]
            data = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
            return self.records.encode_utf8(data, offsets, extra)
        return self.records.encode_many(column.to_pylist(), extra)

    # --- what the dataset is --------------------------------------------------------------------

    def features(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        if self.records is not None:
            result[FEATURE] = {"dtype": "int64", "kind": "ragged"}
        if self.image_field:
            result.update(image=spec("string"), height=spec("int64"), width=spec("int64"))
        if self.label_field:
            result["label"] = spec("int64")
            if self._class_names:
                result["label_name"] = spec("string")
        for name in self.keep_fields:
            result[name] = spec(_scalar_dtype(self.files[0].schema.field(name).type))
        return result

    def class_names(self) -> Optional[list[str]]:
        return list(self._class_names) if self._class_names else None

    @property
    def unit(self) -> str:
        return " documents" if self.records is not None else " examples"

    def split_metadata(self, split: str, shard_stats: list[dict[str, int]]) -> dict[str, Any]:
        source, low, high = self._chosen[split]
        entry: dict[str, Any] = {"source_split": source}
        if self.records is not None:
            entry.update(self.records.split_metadata(shard_stats, with_text=bool(self.text_field)))
        return entry

    def extra_metadata(self) -> dict[str, Any]:
        return self.records.extra_metadata() if self.records is not None else {}

    def write_files(self, out_dir: str) -> list[str]:
        return self.records.write_files(out_dir) if self.records is not None else []

    def identity(self) -> dict[str, Any]:
        listing = hashlib.sha256(json.dumps([[f.relative, f.size, f.mtime] for f in self.files]).encode()).hexdigest()
        return {
            "kind": self.kind, "root": self.root, "config": self.layout.config, "files": listing,
            "splits": {k: list(v) for k, v in self._chosen.items()}, "layout": self.layout.splits,
            "seed": self.seed, "shuffle": self.shuffle, "shuffle_window_mb": self.shuffle_window_mb,
            "text_field": self.text_field, "ids_field": self.ids_field, "image_field": self.image_field,
            "label_field": self.label_field, "keep_fields": self.keep_fields, "class_names": self._class_names,
            "tokens": self.records.identity() if self.records is not None else None,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "path": self.root, "format": self.layout.format, "config": self.layout.config,
            "splits_from": self.layout.how,
            "files": {name: len(files) for name, files in self.layout.splits.items()},
            "ignored_files": self.layout.ignored[:100], "num_ignored_files": len(self.layout.ignored),
            "splits": {name: {"from": s, "rows": [low, high]} if (low, high) != (0.0, 1.0) else {"from": s}
                       for name, (s, low, high) in self._chosen.items()},
            "columns": {c: str(self.files[0].schema.field(c).type) for c in self.columns},
            "text_field": self.text_field, "ids_field": self.ids_field, "image_field": self.image_field,
            "label_field": self.label_field, "keep_fields": self.keep_fields,
            "seed": self.seed, "shuffle": self.shuffle, "shuffle_window_mb": self.shuffle_window_mb,
        }


def _share(fraction: float, rows: int) -> int:
    """How many of the first `rows` rows fall below `fraction` of a cut (rounded, so totals are exact)."""
    return int(math.floor(fraction * rows + 0.5))


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _arrow_reader(handle: pa.NativeFile) -> Any:
    """datasets writes IPC streams; an Arrow IPC file (with its footer) is read too."""
    try:
        return pa.ipc.open_stream(handle)
    except pa.ArrowInvalid:
        handle.seek(0)
        reader = pa.ipc.open_file(handle)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]

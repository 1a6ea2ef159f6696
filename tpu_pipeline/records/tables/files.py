"""The files of a Parquet dataset or a save_to_disk folder, read a *piece* at a time (one Parquet row
group, or one record batch of an Arrow file) with pyarrow.

Row counts and sizes come from the files' metadata (Parquet footers; Arrow batch headers, memory-mapped)
without reading data. A worker reads only the columns it needs (`read_row_group(columns=...)`,
`use_threads=False`: the converter's own workers are the parallelism); each worker thread keeps a few
Parquet files open. Files in a bucket (gs://) are read through tf.io.gfile, with TensorFlow's credentials.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Any, Optional

import pyarrow as pa
import pyarrow.parquet as pq
import tensorflow as tf

from tpu_pipeline.errors import DataError
from tpu_pipeline.records.tables.hub_layout import ARROW, Layout


def is_int(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_boolean(dtype)


def _view(name: str, dtype: pa.DataType) -> bool:
    check = getattr(pa.types, name, None)  # string_view/binary_view: pyarrow 16 and later
    return bool(check and check(dtype))


def is_string(dtype: pa.DataType) -> bool:
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or _view("is_string_view", dtype)


def is_binary(dtype: pa.DataType) -> bool:
    return pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or _view("is_binary_view", dtype)


def is_list(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype)


def scalar_dtype(dtype: pa.DataType) -> Optional[str]:
    """The tf.Example dtype of a scalar column (None: not a scalar)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if is_int(dtype):
        return "int64"
    if pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "float32"
    if is_string(dtype) or is_binary(dtype):
        return "string"
    return None


class TableFile:
    """One file: where it is, its size and mtime (the fingerprint), schema, and pieces."""

    def __init__(self, root: str, relative: str) -> None:
        self.relative = relative
        self.path = relative if "://" in relative or os.path.isabs(relative) else tf.io.gfile.join(root, relative)
        stat = tf.io.gfile.stat(self.path)
        self.size, self.mtime = int(stat.length), int(stat.mtime_nsec)
        self.schema: Optional[pa.Schema] = None
        self.pieces: list[tuple[int, int, int]] = []  # (rows, bytes of the needed columns, first row in the file)

    @property
    def num_rows(self) -> int:
        return sum(piece[0] for piece in self.pieces)


class TableFiles:
    """Every file of the layout's splits (each once), their pieces, and reading one piece."""

    def __init__(self, kind: str, layout: Layout, columns: list[str]) -> None:
        self.kind, self.layout, self.columns = kind, layout, columns
        relatives = list(dict.fromkeys(f for files in layout.splits.values() for f in files))
        self.files = [TableFile(layout.root, r) for r in relatives]
        self.index = {f.relative: i for i, f in enumerate(self.files)}
        self._lock = threading.Lock()
        self._local = threading.local()
        self._arrow: collections.OrderedDict[int, list[pa.RecordBatch]] = collections.OrderedDict()
        for number in range(len(self.files)):
            self._read_footer(number)

    def __getitem__(self, number: int) -> TableFile:
        return self.files[number]

    def __len__(self) -> int:
        return len(self.files)

    def where(self, file: int, piece: int, row: Optional[int] = None) -> str:
        unit = "record batch" if self.layout.format == ARROW else "row group"
        return f"{self.files[file].relative}: {unit} {piece}" + ("" if row is None else f", row {row}")

    def _read_footer(self, number: int) -> None:
        """The file's schema and its pieces' rows and sizes, from its metadata (no data read)."""
        entry = self.files[number]
        try:
            if self.layout.format == ARROW:
                batches = self._arrow_batches(number)
                entry.schema = batches[0].schema if batches else self._arrow_schema(number)
                sizes = [(b.num_rows, b.select([c for c in self.columns if c in b.schema.names]).get_total_buffer_size())
                         for b in batches]
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

    @staticmethod
    def _open_parquet(path: str) -> pq.ParquetFile:
        return pq.ParquetFile(tf.io.gfile.GFile(path, "rb") if "://" in path else path, memory_map=False)

    def _arrow_schema(self, number: int) -> pa.Schema:
        with pa.memory_map(self.files[number].path) as handle:
            return arrow_reader(handle).schema

    def _arrow_batches(self, number: int) -> list[pa.RecordBatch]:
        """An Arrow file's record batches, memory-mapped (zero-copy: pages are read when touched); a few
        files kept open."""
        with self._lock:
            cached = self._arrow.pop(number, None)
            if cached is None:
                cached = list(arrow_reader(pa.memory_map(self.files[number].path)))
            self._arrow[number] = cached
            while len(self._arrow) > 8:
                self._arrow.popitem(last=False)
            return cached

    def read(self, file: int, piece: int, columns: list[str]) -> pa.Table:
        """One piece's `columns` (a worker thread's own open files, a few kept)."""
        try:
            if self.layout.format == ARROW:
                return pa.Table.from_batches([self._arrow_batches(file)[piece].select(columns)])
            cache = getattr(self._local, "files", None)
            if cache is None:
                cache = self._local.files = collections.OrderedDict()
            handle = cache.pop(file, None) or self._open_parquet(self.files[file].path)
            cache[file] = handle
            while len(cache) > 4:
                cache.popitem(last=False)[1].close()
            return handle.read_row_group(piece, columns=columns, use_threads=False)
        except (pa.ArrowException, OSError, tf.errors.OpError) as error:
            raise DataError(f"{self.kind}: cannot read {self.where(file, piece)} ({str(error).splitlines()[0][:200]}); "
                            "copy the file again, or leave it out") from None

    def field(self, column: str) -> pa.DataType:
        return self.files[0].schema.field(column).type

    def schema_metadata(self) -> Optional[dict[bytes, bytes]]:
        return self.files[0].schema.metadata


def arrow_reader(handle: pa.NativeFile) -> Any:
    """datasets writes IPC streams; an Arrow IPC file (with its footer) is read too."""
    try:
        return pa.ipc.open_stream(handle)
    except pa.ArrowInvalid:
        handle.seek(0)
        reader = pa.ipc.open_file(handle)
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]

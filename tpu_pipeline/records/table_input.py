"""Parquet files (the Hugging Face hub's layout) and `datasets.save_to_disk` folders → TFRecord shards:
`convert --from parquet` and `convert --from hf`.

The unit of work is a *piece*: one Parquet row group, or one record batch of an Arrow file. A worker
task reads one piece (only the columns it needs) and encodes all its rows at once; tasks run in
parallel over files and pieces, and their results come back in order (`encode_stream`).

The parts, one module each in `tables/`: which files make which split (hub_layout.py), reading
pieces (files.py), which rows each output split holds and their order (order.py: seeded windows of
row groups, exact resume), and the columns → tf.Examples (columns.py).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.record_limits import MAX_RECORD_TOKENS
from tpu_pipeline.format.tokenizer import ByteTokenizer, IdsTokenizer, Tokenizer, load_tokenizer
from tpu_pipeline.records.parallel import ordered_map
from tpu_pipeline.records.sharding import RECORD_OVERHEAD
from tpu_pipeline.records.tables.columns import OUT_NAMES, Columns, Result
from tpu_pipeline.records.tables.files import TableFiles
from tpu_pipeline.records.tables.hub_layout import ARROW, Layout, find_hf, find_parquet
from tpu_pipeline.records.tables.order import SplitOrder
from tpu_pipeline.records.token_records import TokenRecords, check_token_flags
from tpu_pipeline.system import local_path

SHUFFLE_WINDOW_MB = 256  # rows are shuffled within windows of about this much data (--shuffle_window_mb)


class TableSource:
    """A Parquet dataset or a save_to_disk folder as a ConvertSource whose tasks are whole pieces."""

    def __init__(
        self, path: str, *, kind: str = "parquet", config: Optional[str] = None, splits: Optional[str] = None,
        seed: int = 0, shuffle: bool = True, text_field: Optional[str] = None, ids_field: Optional[str] = None,
        vocab_size: Optional[int] = None, tokenizer: Union[str, Tokenizer] = "bytes",
        max_record_tokens: int = MAX_RECORD_TOKENS, image_field: Optional[str] = None,
        label_field: Optional[str] = None, keep_fields: Sequence[str] = (), class_names: Optional[Sequence[str]] = None,
        shuffle_window_mb: float = SHUFFLE_WINDOW_MB, chat: Optional[Callable[[str], Any]] = None,
    ) -> None:
        """`chat`: for `convert --from chat`, the records of a schema (records.chat_input.chat_records), which
        the first file's columns choose."""
        self.kind = kind
        keep_fields = list(dict.fromkeys(keep_fields))
        _check_flags(text_field, ids_field, vocab_size, tokenizer, image_field, label_field, keep_fields,
                     max_record_tokens, shuffle_window_mb)
        self.seed, self.shuffle, self.shuffle_window_mb = seed, shuffle, float(shuffle_window_mb)
        self.records: Optional[TokenRecords] = None
        if text_field or ids_field:
            chosen = (IdsTokenizer(int(vocab_size)) if ids_field else
                      load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer)
            self.records = TokenRecords(chosen, int(max_record_tokens))
        self.layout: Layout = (find_hf if kind == "hf" else find_parquet)(local_path(path, absolute=True), config)
        if chat is not None:
            from tpu_pipeline.records.chat_records import detect_schema
            from tpu_pipeline.records.tables.chat_columns import ChatColumns

            first = TableFiles(kind, self.layout, [])[0]
            self.records = chat(detect_schema(first.schema.names, f"{kind}: {first.relative}"))
            self.columns: Any = ChatColumns(self.records)
            self.max_workers = 2  # rows as Python objects, a template each: more threads contend for the GIL
        else:
            self.columns = Columns(text_field, ids_field, image_field, label_field, keep_fields, self.records)
        self.root = self.layout.root
        if self.layout.format == ARROW and "://" in self.root:
            raise ConfigError(f"--from hf: {path} is in a bucket; save_to_disk folders are read memory-mapped from a "
                              "local disk: copy it there first (gsutil -m cp -r), or convert the dataset's Parquet files")
        self.name = os.path.basename(self.root.rstrip("/")) or "dataset"
        self.files = TableFiles(kind, self.layout, self.columns.names)
        if not self.columns.names:
            schema = self.files[0].schema
            raise ConfigError(f"--from {kind}: name the columns to convert: --text_field (or --ids_field) for text, "
                              "--image_field [--label_field] for images, --keep_fields for others; the columns of "
                              f"{self.files[0].relative}: {', '.join(f'{n} ({t})' for n, t in zip(schema.names, schema.types))}")
        self.columns.check(self.files)
        self.columns.find_class_names(self.files, class_names, self.layout.hf_features)
        self.order = SplitOrder(self.files, splits, seed, shuffle, self.shuffle_window_mb)

    # --- the ConvertSource interface ------------------------------------------------------------

    def split_sizes(self) -> dict[str, int]:
        return self.order.sizes()

    def estimate_bytes(self, split: str) -> int:
        total = 0.0
        for file, piece, count in self.order.pieces[split]:
            rows, size, _ = self.files[file].pieces[piece]
            total += size * count / max(1, rows) + count * (RECORD_OVERHEAD + 24)
        if self.records is not None and self.columns.text_field and not isinstance(self.records.tokenizer, ByteTokenizer):
            total *= 0.5  # subword ids: fewer bytes than the text
        return int(total)

    def items(self, split: str, start: int) -> Iterator[Any]:
        raise NotImplementedError("TableSource encodes whole pieces: the converter calls encode_stream")

    def encode(self, item: Any) -> bytes:
        raise NotImplementedError("TableSource encodes whole pieces: the converter calls encode_stream")

    def encode_stream(self, split: str, start: int, executor: concurrent.futures.Executor,
                      workers: int) -> Iterator[Result]:
        """(record, error) of each position of `split` from `start`, in write order: one task per piece,
        in parallel; a window's rows shuffled together once all its pieces are back. In flight: the
        pieces of a window and one per worker."""
        windows, starts = self.order.windows(split)
        pieces = self.order.pieces[split]
        first = self.order.window_of(split, start)
        tasks = (i for w in range(first, len(windows)) for i in windows[w])
        ahead = max(map(len, windows)) + max(1, workers)
        results = ordered_map(lambda i: self._encode_piece(split, *pieces[i][:2]), tasks, executor, ahead)
        try:
            for w in range(first, len(windows)):
                rows: list[Result] = []
                for _ in windows[w]:
                    rows.extend(next(results))
                skip = start - starts[w] if w == first else 0
                for position, row in enumerate(self.order.window_order(split, w, len(rows))):
                    if position >= skip:
                        yield rows[row]
        finally:
            results.close()

    def _encode_piece(self, split: str, file: int, piece: int) -> list[Result]:
        table = self.files.read(file, piece, self.columns.names)
        rows = self.order.rows(split, file, piece)
        if rows is not None:
            table = table.take(rows)
        first = self.files[file].pieces[piece][2]
        numbers = (np.arange(table.num_rows) if rows is None else rows) + first
        return self.columns.encode(table, [self.files.where(file, piece, int(n)) for n in numbers.tolist()])

    # --- what the dataset is --------------------------------------------------------------------

    def features(self) -> dict[str, dict[str, Any]]:
        return self.columns.features()

    def class_names(self) -> Optional[list[str]]:
        return list(self.columns.class_names) if self.columns.class_names else None

    @property
    def unit(self) -> str:
        if hasattr(self.records, "chat_entry"):
            return " conversations"
        return " documents" if self.records is not None else " examples"

    def split_metadata(self, split: str, shard_stats: list[dict[str, int]]) -> dict[str, Any]:
        entry: dict[str, Any] = {"source_split": self.order.chosen[split][0]}
        if self.records is not None:
            entry.update(self.records.split_metadata(shard_stats, with_text=bool(self.columns.text_field)))
        return entry

    def extra_metadata(self) -> dict[str, Any]:
        return self.records.extra_metadata() if self.records is not None else {}

    def write_files(self, out_dir: str) -> list[str]:
        return self.records.write_files(out_dir) if self.records is not None else []

    def _fields(self) -> dict[str, Any]:
        c = self.columns
        return {"text_field": c.text_field, "ids_field": c.ids_field, "image_field": c.image_field,
                "label_field": c.label_field, "keep_fields": c.keep_fields}

    def identity(self) -> dict[str, Any]:
        listing = hashlib.sha256(json.dumps([[f.relative, f.size, f.mtime] for f in self.files.files]).encode()).hexdigest()
        return {
            "kind": self.kind, "root": self.root, "config": self.layout.config, "files": listing,
            "splits": {k: list(v) for k, v in self.order.chosen.items()}, "layout": self.layout.splits,
            "seed": self.seed, "shuffle": self.shuffle, "shuffle_window_mb": self.shuffle_window_mb,
            "class_names": self.columns.class_names, **self._fields(),
            "tokens": self.records.identity() if self.records is not None else None,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "path": self.root, "format": self.layout.format, "config": self.layout.config,
            "splits_from": self.layout.how,
            "files": {name: len(files) for name, files in self.layout.splits.items()},
            "ignored_files": self.layout.ignored[:100], "num_ignored_files": len(self.layout.ignored),
            "splits": {name: {"from": s, "rows": [low, high]} if (low, high) != (0.0, 1.0) else {"from": s}
                       for name, (s, low, high) in self.order.chosen.items()},
            "columns": {c: str(self.files.field(c)) for c in self.columns.names}, **self._fields(),
            "seed": self.seed, "shuffle": self.shuffle, "shuffle_window_mb": self.shuffle_window_mb,
        }


def _check_flags(text_field, ids_field, vocab_size, tokenizer, image_field, label_field, keep_fields,
                 max_record_tokens, shuffle_window_mb) -> None:
    check_token_flags(text_field, ids_field, vocab_size, tokenizer)
    if not (text_field or ids_field) and tokenizer != "bytes":
        raise ConfigError("--tokenizer: only with --text_field (the column to tokenize)")
    if max_record_tokens < 0:
        raise ConfigError(f"--max_record_tokens must be >= 0 (0: one record per document; given: {max_record_tokens})")
    if not shuffle_window_mb > 0:
        raise ConfigError(f"--shuffle_window_mb must be > 0 (given: {shuffle_window_mb})")
    used = [c for c in (text_field, ids_field, image_field, label_field) if c]
    twice = sorted({c for c in [*used, *keep_fields] if [*used, *keep_fields].count(c) > 1})
    if twice:
        raise ConfigError(f"--keep_fields: {twice} already converted by --text_field/--ids_field/--image_field/"
                          "--label_field; leave them out of --keep_fields")
    clash = sorted(set(keep_fields) & set(OUT_NAMES))
    if clash:
        raise ConfigError(f"--keep_fields: {clash} would clash with the features this converter writes "
                          f"({', '.join(OUT_NAMES)}); rename the column(s) first")

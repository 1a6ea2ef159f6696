"""What the converter needs from an input format (`ConvertSource`), and what an input format may give back.

Each format (image folder, CSV, NumPy, TFDS, text, Parquet/Arrow) implements this interface and imports only it,
not the converter that drives it (tpu_pipeline.records.convert).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Mapping, Optional, Protocol


class ItemError(Exception):
    """One input item (an image file, a CSV line) cannot be converted; `where` names it for the user."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Encoded:
    """What `encode` may return instead of the serialized example: the records of one item, written one
    after another (none: the item is counted but not written, e.g. an empty document; several: a long
    document in parts of bounded size), plus numbers summed per shard and per split (tokens, text bytes;
    a key starting with "max_" keeps the largest instead) that the source's `split_metadata` turns into
    metadata.json keys."""

    records: tuple[bytes, ...]
    stats: Mapping[str, int] = dataclasses.field(default_factory=dict)


class ConvertSource(Protocol):
    """What the converter needs from an input format. `encode` runs in worker threads.

    Optional hooks (see `SourceExtras`), looked up with getattr so the other sources need none.
    """

    kind: str  # the --from name, e.g. "image-folder"
    name: str  # a short dataset name for metadata.json

    def split_sizes(self) -> dict[str, int]: ...
    def estimate_bytes(self, split: str) -> int: ...
    def items(self, split: str, start: int) -> Iterator[Any]: ...  # in write order, from `start`
    def encode(self, item: Any) -> bytes: ...  # a serialized tf.Example; raises ItemError
    def features(self) -> dict[str, dict[str, Any]]: ...
    def class_names(self) -> Optional[list[str]]: ...
    def identity(self) -> dict[str, Any]: ...  # everything the output depends on (fingerprinted)
    def describe(self) -> dict[str, Any]: ...  # the metadata's human-readable `source`


class SourceExtras(Protocol):
    """The optional part of a source: more metadata and files, written after the shards, before metadata.json."""

    def split_metadata(self, split: str, shard_stats: list[dict[str, int]]) -> dict[str, Any]: ...  # new split keys
    def extra_metadata(self) -> dict[str, Any]: ...  # new top-level keys, e.g. the tokenizer
    def write_files(self, out_dir: str) -> list[str]: ...  # files written next to the shards (atomically); their names
    # Instead of items/encode: (record, ItemError or None) of each position from `start`, in write order,
    # the source submitting tasks of many items each (a Parquet row group) to `executor` itself.
    def encode_stream(self, split: str, start: int, executor: Any, workers: int) -> Iterator[tuple[Any, Optional[ItemError]]]: ...
    unit: str  # the progress bar's unit, e.g. " documents"
    # At most this many worker threads: a source whose encoding is mostly Python (chat: a conversation's messages,
    # its template) only loses with more, its threads taking turns on the GIL with the writer's (measured before
    # its Python was trimmed: 4 workers took 2.9 times as long as 1 on the chat demo)
    max_workers: int

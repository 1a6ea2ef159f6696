"""Text corpora → tf.Examples of token ids (`tokens`, int64, ragged): `convert --from text`.

Inputs are files, quoted globs and directories (every *.txt/*.jsonl/*.json under them, sorted).
A document is a whole .txt file, a line of it (`document_per_line`), or one JSON line's
`text_field` (or its pre-tokenized `ids_field`). Documents are shuffled with `seed` and cut into
splits by fraction, as for CSV rows; each one's ids end with the tokenizer's EOS.

A document over `max_record_tokens` ids is written as consecutive records of at most that many (its
parts; EOS only at the end of the last): reading a record costs memory in proportion to its size, so a
bounded record keeps a 30 MB document from costing gigabytes where it is parsed. The pipeline reads each
part as an example.

Only offsets are kept in memory: the constructor counts the lines (one pass over the files), the
writer's thread reads each document's bytes when its turn comes, and worker threads decode and
tokenize them, a batch of documents per task. Empty documents are counted (`num_empty`), not written; a line that is not UTF-8 or
not JSON is an ItemError naming file:line.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
from typing import Any, BinaryIO, Iterator, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.record_limits import MAX_RECORD_TOKENS
from tpu_pipeline.format.tokenizer import IdsTokenizer, Tokenizer, load_tokenizer
from tpu_pipeline.records.convert_input import Encoded, ItemError
from tpu_pipeline.records.parallel import ordered_map
from tpu_pipeline.records.sharding import RECORD_OVERHEAD, assign_splits, split_fractions
from tpu_pipeline.records.token_records import FEATURE, LONG_DOCUMENT_TOKENS, TokenRecords, check_token_flags
from tpu_pipeline.system import local_path

TEXT_SUFFIXES = (".txt",)
JSON_SUFFIXES = (".jsonl", ".json")
_BOM = b"\xef\xbb\xbf"
_GLOB = set("*?[")
_OPEN_FILES = 32  # handles the reader keeps open while documents of many files interleave
BATCH_DOCUMENTS = 256  # documents per worker task, at most ...
BATCH_BYTES = 1 << 20  # ... and about this much text (a larger document is a batch of its own)
Item = tuple[int, bytes]  # (document index, its raw bytes)


def _open(path: str) -> BinaryIO:
    return open(path, "rb") if "://" not in path else tf.io.gfile.GFile(path, "rb")


def _walk(directory: str) -> list[str]:
    """Every *.txt/*.jsonl/*.json file under `directory`, sorted; hidden files and folders are not inputs."""
    found = []
    for root, _, names in tf.io.gfile.walk(directory):
        relative = os.path.relpath(root, directory)
        if relative != "." and any(part.startswith(".") for part in relative.split(os.sep)):
            continue
        found += [tf.io.gfile.join(root, name) for name in names
                  if not name.startswith(".") and name.lower().endswith(TEXT_SUFFIXES + JSON_SUFFIXES)]
    return sorted(found)


def expand_inputs(paths: Sequence[str], json_lines: bool) -> list[str]:
    """Files, globs and directories → files in the given order (directories sorted), each once."""
    if not paths:
        raise ConfigError("--from text needs at least one input: files, quoted globs or directories")
    files: list[str] = []
    for given in paths:
        path = local_path(given, absolute=True)
        if _GLOB & set(given):
            matches = sorted(tf.io.gfile.glob(path))
            if not matches:
                raise DataError(f"text: {given!r} matches no file")
        elif tf.io.gfile.exists(path):
            matches = [path]
        else:
            raise DataError(f"text: {given!r} does not exist")
        for match in matches:
            if tf.io.gfile.isdir(match):
                found = _walk(match)
                if not found:
                    raise DataError(f"text: directory {match!r} holds no *.txt, *.jsonl or *.json file")
                files += found
            else:
                files.append(match)
    for path in files:
        name = path.lower()
        if not json_lines and name.endswith(JSON_SUFFIXES):
            raise ConfigError(f"--from text: {path} is JSON lines: pass --text_field NAME (or --ids_field NAME) to "
                              "read it, or leave it out of the inputs")
        if json_lines and name.endswith(TEXT_SUFFIXES):
            raise ConfigError(f"--text_field/--ids_field read JSON lines, and {path} is a .txt file: leave it out "
                              "of the inputs (give the .jsonl files, or a quoted glob of them)")
    return list(dict.fromkeys(files))


def line_bounds(path: str) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) byte offsets of each line (end before its '\\n'); no line after a final newline."""
    newlines, size = [], 0
    with _open(path) as handle:
        while True:
            chunk = handle.read(1 << 24)
            if not chunk:
                break
            newlines.append(np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10) + size)
            size += len(chunk)
    ends = np.concatenate(newlines + [np.array([size], np.int64)]).astype(np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    if starts[-1] == size:  # the file is empty or ends with a newline
        starts, ends = starts[:-1], ends[:-1]
    return starts, ends


def _stat(path: str) -> tuple[int, int]:
    if "://" in path:
        stat = tf.io.gfile.stat(path)
        return int(stat.length), int(stat.mtime_nsec)
    stat = os.stat(path)
    return int(stat.st_size), int(stat.st_mtime_ns)


class TextSource:
    """A text corpus as a ConvertSource: documents by offset, read in write order, tokenized in workers."""

    kind = "text"
    batch_documents, batch_bytes = BATCH_DOCUMENTS, BATCH_BYTES  # a worker task's documents, at most

    def __init__(
        self, paths: Sequence[str], *, splits: str = "train", seed: int = 0, shuffle: bool = True,
        tokenizer: Union[str, Tokenizer] = "bytes", document_per_line: bool = False,
        text_field: Optional[str] = None, ids_field: Optional[str] = None, vocab_size: Optional[int] = None,
        max_record_tokens: int = MAX_RECORD_TOKENS,
    ) -> None:
        if isinstance(paths, str):
            paths = [paths]
        self._check_flags(tokenizer, document_per_line, text_field, ids_field, vocab_size)
        if max_record_tokens < 0:
            raise ConfigError(f"--max_record_tokens must be >= 0 (0: one record per document; given: {max_record_tokens})")
        self.max_record_tokens = int(max_record_tokens)
        self.text_field, self.ids_field = text_field, ids_field
        self.json_lines = bool(text_field or ids_field)
        self.per_line = document_per_line or self.json_lines
        self.tokenizer: Tokenizer = (
            IdsTokenizer(int(vocab_size)) if ids_field else load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        )
        self.records = TokenRecords(self.tokenizer, self.max_record_tokens)
        self.seed, self.shuffle = seed, shuffle
        self.fractions = split_fractions(splits)
        self.inputs = [local_path(p, absolute=True) for p in paths]
        self.files = expand_inputs(paths, self.json_lines)
        self.stats = [_stat(path) for path in self.files]
        first = self.inputs[0].rstrip("/")
        self.name = os.path.splitext(os.path.basename(first))[0] if len(self.inputs) == 1 and not _GLOB & set(first) else "text"
        self._index()
        self._splits = assign_splits(len(self.file_ids), self.fractions, seed, shuffle)

    @staticmethod
    def _check_flags(tokenizer: Union[str, Tokenizer], per_line: bool, text_field: Optional[str],
                     ids_field: Optional[str], vocab_size: Optional[int]) -> None:
        check_token_flags(text_field, ids_field, vocab_size, tokenizer)
        if per_line and (text_field or ids_field):
            raise ConfigError("--document_per_line: JSON lines are one document per line already; leave the flag out")

    def _index(self) -> None:
        """Every document's file, line and byte range, as arrays (a few bytes each, whatever the corpus)."""
        if not self.per_line:
            count = len(self.files)
            self.file_ids = np.arange(count, dtype=np.int32)
            self.lines = np.zeros(count, np.int64)
            self.starts, self.ends = np.zeros(count, np.int64), np.full(count, -1, np.int64)
            return
        if any("://" in path for path in self.files):
            logging.warning("text: remote inputs are read with one seek per line; a local copy converts faster.")
        file_ids, lines, starts, ends = [], [], [], []
        for index, path in enumerate(self.files):
            begin, end = line_bounds(path)
            file_ids.append(np.full(len(begin), index, np.int32))
            lines.append(np.arange(1, len(begin) + 1, dtype=np.int64))
            starts.append(begin)
            ends.append(end)
        self.file_ids = np.concatenate(file_ids)
        self.lines, self.starts, self.ends = np.concatenate(lines), np.concatenate(starts), np.concatenate(ends)

    def split_sizes(self) -> dict[str, int]:
        return {name: len(indices) for name, indices in self._splits.items()}

    def estimate_bytes(self, split: str) -> int:
        indices = self._splits[split]
        step = max(1, len(indices) // 256)
        sizes = []
        for item in self._read(indices[::step]):
            try:
                encoded = self.encode(item)
            except ItemError:
                continue
            sizes.append(sum(len(record) + RECORD_OVERHEAD for record in encoded.records))
        mean = sum(sizes) / len(sizes) if sizes else 100
        return int(mean * len(indices))

    def items(self, split: str, start: int) -> Iterator[Item]:
        return self._read(self._splits[split][start:])

    def encode_stream(self, split: str, start: int, executor: concurrent.futures.Executor,
                      workers: int) -> Iterator[tuple[Optional[Encoded], Optional[ItemError]]]:
        """Each document's records from `start` on, in order, encoded a batch per worker task (up to
        BATCH_DOCUMENTS documents or BATCH_BYTES of text): a future per document cost more than a short
        document's tokenizing. At most 2 x workers + 2 batches are in flight."""
        def batches() -> Iterator[list[Item]]:
            batch, size = [], 0
            for item in self.items(split, start):
                batch.append(item)
                size += len(item[1])
                if size >= self.batch_bytes or len(batch) >= self.batch_documents:
                    yield batch
                    batch, size = [], 0
            if batch:
                yield batch

        for results in ordered_map(self.encode_batch, batches(), executor, 2 * workers + 2):
            yield from results

    def encode_batch(self, batch: list[Item]) -> list[tuple[Optional[Encoded], Optional[ItemError]]]:
        """Each item's records or error, in order (one worker task)."""
        done: list[tuple[Optional[Encoded], Optional[ItemError]]] = []
        for item in batch:
            try:
                done.append((self.encode(item), None))
            except ItemError as error:
                done.append((None, error))
        return done

    def _read(self, documents: np.ndarray) -> Iterator[Item]:
        """Each document's bytes, in the given order (a seek per line, a few files kept open)."""
        handles: collections.OrderedDict[int, BinaryIO] = collections.OrderedDict()
        try:
            for doc in documents.tolist():
                file_id, start, end = int(self.file_ids[doc]), int(self.starts[doc]), int(self.ends[doc])
                if end < 0:
                    with _open(self.files[file_id]) as handle:
                        yield doc, handle.read()
                    continue
                handle = handles.pop(file_id, None)
                handles[file_id] = handle = handle if handle is not None else _open(self.files[file_id])
                if len(handles) > _OPEN_FILES:
                    handles.popitem(last=False)[1].close()
                handle.seek(start)
                yield doc, handle.read(end - start)
        finally:
            for handle in handles.values():
                handle.close()

    def where(self, doc: int) -> str:
        path = self.files[int(self.file_ids[doc])]
        return f"{path}:{int(self.lines[doc])}" if self.per_line else path

    def encode(self, item: Item) -> Encoded:
        doc, (text, size) = item[0], self._decoded(item)
        if self.json_lines:
            return self._encode_json(doc, text)
        return self._encode_ids(self.tokenizer.encode(text) if text else [], size)

    def text_of(self, item: Item) -> str:
        """A document's text: its bytes without a BOM or a line's CR, decoded; not UTF-8 is an ItemError."""
        return self._decoded(item)[0]

    def _decoded(self, item: Item) -> tuple[str, int]:
        doc, raw = item
        if self.starts[doc] == 0 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        if self.per_line and raw.endswith(b"\r"):  # a CRLF line ending is not part of the line
            raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            line = raw[: error.start].count(b"\n") + 1
            at = "" if self.per_line else f" on line {line}"
            raise ItemError(self.where(doc), f"not UTF-8 text ({error.reason} at byte {error.start}{at}); "
                                             "save it as UTF-8") from None
        return text, len(raw)

    def json_object(self, text: str, doc: int) -> dict[str, Any]:
        """One JSON line's object; anything else is an ItemError naming file:line."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ItemError(self.where(doc), f"not valid JSON ({error.msg} at column {error.colno}); JSON lines "
                                             "hold one object per line") from None
        if not isinstance(value, dict):
            raise ItemError(self.where(doc), f"a JSON {type(value).__name__} where one object per line is expected")
        return value

    def _encode_json(self, doc: int, text: str) -> Encoded:
        if not text.strip():  # a blank line holds no document: counted as empty
            return Encoded((), {"empty": 1})
        value = self.json_object(text, doc)
        field = self.ids_field or self.text_field
        if field not in value:
            raise ItemError(self.where(doc), f"no field {field!r} (its fields: {sorted(value)[:20]}); "
                                             f"set --{'ids' if self.ids_field else 'text'}_field")
        content = value[field]
        if self.ids_field:
            return self._encode_ids(self._check_ids(doc, content), None)
        if not isinstance(content, str):
            raise ItemError(self.where(doc), f"field {field!r} is a JSON {type(content).__name__}, not a string")
        return self._encode_ids(self.tokenizer.encode(content) if content else [], len(content.encode("utf-8")))

    def _check_ids(self, doc: int, content: Any) -> list[int]:
        if not isinstance(content, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in content):
            raise ItemError(self.where(doc), f"field {self.ids_field!r} must be a list of integers")
        size = self.tokenizer.vocab_size
        for position, i in enumerate(content):
            if not 0 <= i < size:
                raise ItemError(self.where(doc), f"id {i} (position {position}) is outside [0, {size}) "
                                                 f"(--vocab_size {size})")
        return content

    def _encode_ids(self, ids: list[int], text_bytes: Optional[int]) -> Encoded:
        return self.records.encode_ids(ids, text_bytes)

    def features(self) -> dict[str, dict[str, Any]]:
        return {FEATURE: {"dtype": "int64", "kind": "ragged"}}

    def class_names(self) -> Optional[list[str]]:
        return None

    def split_metadata(self, split: str, shard_stats: list[dict[str, int]]) -> dict[str, Any]:
        """Documents, tokens and text bytes per split, and tokens per shard (to plan packing and steps)."""
        return self.records.split_metadata(shard_stats, with_text=not self.ids_field)

    def extra_metadata(self) -> dict[str, Any]:
        return self.records.extra_metadata()

    def write_files(self, out_dir: str) -> list[str]:
        return self.records.write_files(out_dir)

    def identity(self) -> dict[str, Any]:
        listing = hashlib.sha256(json.dumps([self.files, self.stats]).encode()).hexdigest()
        return {
            "kind": self.kind, "files": listing, "num_files": len(self.files), "num_documents": len(self.file_ids),
            "per_line": self.per_line, "text_field": self.text_field, "ids_field": self.ids_field,
            "tokenizer": self.tokenizer.describe(), "tokenizer_sha256": getattr(self.tokenizer, "model_sha256", None),
            "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle,
            "max_record_tokens": self.max_record_tokens,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "inputs": self.inputs[:100], "num_inputs": len(self.inputs),  # a shell glob can be long
            "num_files": len(self.files), "num_documents": len(self.file_ids),
            "document_per_line": self.per_line and not self.json_lines, "text_field": self.text_field,
            "ids_field": self.ids_field, "splits": self.fractions, "seed": self.seed, "shuffle": self.shuffle,
        }

"""Token ids → the `tokens` tf.Examples of a text dataset, many documents at a time; and what such a
dataset adds to metadata.json (tokens per shard and split, the tokenizer, its model file).

Both text converters use it: `--from text` one document per call (`encode_ids`), `--from parquet` and
`--from hf` a row group's documents per call (`encode_many`, `encode_flat`). The records are the bytes
`tf.train.Example(...).SerializeToString()` gives (a test compares them), written by NumPy: building
a protobuf Int64List from a Python list costs ~40 ns a token and holds the GIL, which made it the
slowest step of a byte-level conversion; a whole row group's ids are varint-encoded here in a few
array operations instead.
"""
from __future__ import annotations

import collections
import itertools
import uuid
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.format.record_limits import MAX_RECORD_TOKENS
from tpu_pipeline.format.tokenizer import BYTE_OFFSET, ByteTokenizer, Tokenizer
from tpu_pipeline.records.convert_input import Encoded

FEATURE = "tokens"
# A document longer than this (in tokens) is far longer than any row a model trains on: convert counts
# such documents and says what a data.sequence pipeline does with them.
LONG_DOCUMENT_TOKENS = 65_536
EMPTY = Encoded((), {"empty": 1})


def check_token_flags(text_field: Optional[str], ids_field: Optional[str], vocab_size: Optional[int],
                      tokenizer: Any) -> None:
    """The token flags every text converter shares (--from text, parquet, hf), each misuse in one line."""
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


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [_encode_varint(v) for v in range(1 << 14)]  # the lengths of most records and features, ready-made


def _varint(value: int) -> bytes:
    return _SMALL[value] if value < 16384 else _encode_varint(value)


def varints(values: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Protobuf varints of int64s, concatenated, and which values took more than one byte (None: none
    did). A negative int64 takes 10 bytes, its two's complement, as protobuf writes it."""
    if not len(values):
        return np.empty(0, np.uint8), None
    low, top = int(values.min()), int(values.max())
    if low >= 0 and top < 0x80:  # byte-level ids of plain ASCII: one byte each
        return values.astype(np.uint8), None
    if low >= 0 and top < 1 << 14:  # byte-level ids, vocabularies up to 16k: one or two bytes, in uint16
        v = values.astype(np.uint16, copy=False)
        two = v >= 0x80
        low = (v & 0x7F).astype(np.uint8) | (two.view(np.uint8) << 7)
        where = np.flatnonzero(two)
        if len(where) < len(v) // 4:  # mostly one byte (ASCII text): insert the few second bytes
            return np.insert(low, where + 1, (v[where] >> 7).astype(np.uint8)), two
        table = np.empty((len(v), 2), np.uint8)
        table[:, 0] = low
        table[:, 1] = (v >> 7).astype(np.uint8)
        keep = np.empty((len(v), 2), bool)
        keep[:, 0] = True
        keep[:, 1] = two
        return table[keep], two
    v = values.astype(np.uint64, copy=False)
    width = (int(v.max()).bit_length() + 6) // 7
    size = np.ones(len(v), np.uint8)
    for k in range(1, width):
        size += v >= np.uint64(1 << (7 * k))
    table = np.empty((len(v), width), np.uint8)
    for k in range(width):
        table[:, k] = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | ((size > k + 1).view(np.uint8) << 7)
    return table[np.arange(width, dtype=np.uint8)[None, :] < size[:, None]], size - 1


def token_examples(ids: np.ndarray, bounds: np.ndarray, others: Optional[Sequence[bytes]] = None,
                   name: str = FEATURE) -> list[bytes]:
    """Serialized `{<name>: int64 list}` tf.Examples (`tokens`), one per [bounds[i], bounds[i+1]) of `ids` (every
    range non-empty): exactly the bytes of `tf.train.Example(...).SerializeToString()`. `others[i]`, when
    given, holds more features of record i, serialized as a `tf.train.Features` (its map entries)."""
    data, extra = varints(ids)
    bounds = np.asarray(bounds, np.int64)
    if extra is not None and len(bounds) > 1:  # each record's bytes beyond one per id, summed per record
        per_record = np.add.reduceat(extra.astype(np.int64, copy=False), bounds[:-1])
        offsets = (bounds + np.concatenate([[0], np.cumsum(per_record)])).tolist()
    else:
        offsets = bounds.tolist()
    view = memoryview(data)
    key = _varint(len(name)) + name.encode()
    records = []
    for index, (start, end) in enumerate(zip(offsets[:-1], offsets[1:])):
        other = others[index] if others is not None else b""
        payload = end - start  # Int64List{value: packed} in Feature{int64_list} in the map entry in Features in Example
        int64_list = 1 + len(_varint(payload)) + payload
        feature = 1 + len(_varint(int64_list)) + int64_list
        entry = 1 + len(key) + 1 + len(_varint(feature)) + feature
        features = 1 + len(_varint(entry)) + entry + len(other)
        records.append(b"".join((b"\x0a", _varint(features), b"\x0a", _varint(entry), b"\x0a", key, b"\x12",
                                 _varint(feature), b"\x1a", _varint(int64_list), b"\x0a", _varint(payload),
                                 view[start:end], other)))
    return records


def tokens_example(ids: Sequence[int]) -> bytes:
    """One document's (or part's) ids as a tf.Example, through protobuf (negative ids included)."""
    feature = tf.train.Feature(int64_list=tf.train.Int64List(value=ids))
    return tf.train.Example(features=tf.train.Features(feature={FEATURE: feature})).SerializeToString()


class TokenRecords:
    """Documents' ids (+ EOS) → the Encoded records and per-document stats of a text dataset."""

    def __init__(self, tokenizer: Tokenizer, max_record_tokens: int = MAX_RECORD_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.max_record_tokens = int(max_record_tokens)

    def _stats(self, length: int, parts: int, text_bytes: Optional[int]) -> dict[str, int]:
        stats = {"documents": 1, "tokens": length, "max_tokens": length,  # max_: the converter keeps the largest
                 "long_documents": int(length > LONG_DOCUMENT_TOKENS), "split_documents": int(parts > 1)}
        if text_bytes is not None:
            stats["text_bytes"] = text_bytes
        return stats

    def encode_ids(self, ids: list[int], text_bytes: Optional[int]) -> Encoded:
        """One document's ids (+ EOS) as Examples of at most max_record_tokens ids each (its parts, in
        order); no ids at all is an empty document, counted."""
        if not ids:
            return EMPTY
        if self.tokenizer.eos_id is not None:
            ids = ids + [self.tokenizer.eos_id]
        step = self.max_record_tokens or len(ids)
        records = tuple(tokens_example(ids[start:start + step]) for start in range(0, len(ids), step))
        return Encoded(records, self._stats(len(ids), len(records), text_bytes))

    def encode_many(self, texts: Sequence[str], others: Optional[Sequence[bytes]] = None) -> list[Encoded]:
        """Many documents' text; byte-level text is tokenized as one array. `others[i]`: more features of
        document i (a serialized tf.train.Features), written into each of its records."""
        if isinstance(self.tokenizer, ByteTokenizer) and not self.tokenizer.added_tokens:
            raw = [text.encode("utf-8") for text in texts]
            lengths = np.fromiter(map(len, raw), np.int64, len(raw))
            return self.encode_utf8(np.frombuffer(b"".join(raw), np.uint8), np.concatenate([[0], np.cumsum(lengths)]),
                                    others)
        encode = self.tokenizer.encode
        ids = [encode(text) if text else [] for text in texts]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
        text_bytes = np.fromiter((len(text.encode("utf-8")) for text in texts), np.int64, len(texts))
        return self.encode_flat(flat, np.concatenate([[0], np.cumsum(lengths)]), text_bytes, others)

    def encode_utf8(self, data: np.ndarray, offsets: np.ndarray,
                    others: Optional[Sequence[bytes]] = None) -> list[Encoded]:
        """Byte-level: documents as one UTF-8 buffer and their [offsets[i], offsets[i+1]) ranges."""
        offsets = np.asarray(offsets, np.int64)
        first = int(offsets[0])
        ids = data[first:int(offsets[-1])].astype(np.uint16) + np.uint16(BYTE_OFFSET)  # 3..258: uint16 is enough
        return self.encode_flat(ids, offsets - first, np.diff(offsets), others)

    def encode_flat(self, flat: np.ndarray, offsets: np.ndarray, text_bytes: Optional[np.ndarray],
                    others: Optional[Sequence[bytes]] = None) -> list[Encoded]:
        """Documents as one array of ids (no EOS yet) and their ranges → one Encoded per document."""
        offsets = np.asarray(offsets, np.int64)
        lengths = np.diff(offsets)
        eos = self.tokenizer.eos_id
        if eos is not None:  # each non-empty document's ids, then EOS
            ends = offsets[1:][lengths > 0]
            flat = np.insert(flat, ends, eos)
            lengths = lengths + (lengths > 0)
        step = self.max_record_tokens
        cuts, parts, record_others = [0], [], [] if others is not None else None
        position = 0
        for index, length in enumerate(lengths.tolist()):
            count = 0
            if length:
                count = -(-length // step) if step else 1
                if count == 1:
                    cuts.append(position + length)
                else:
                    cuts.extend(range(position + step, position + length, step))
                    cuts.append(position + length)
            parts.append(count)
            if record_others is not None:
                record_others.extend([others[index]] * count)
            position += length
        records = token_examples(flat, np.asarray(cuts, np.int64), record_others)
        sizes = None if text_bytes is None else text_bytes.tolist()
        result, at = [], 0
        for index, (length, count) in enumerate(zip(lengths.tolist(), parts)):
            if not count:
                result.append(EMPTY)
                continue
            result.append(Encoded(tuple(records[at:at + count]),
                                  self._stats(length, count, None if sizes is None else sizes[index])))
            at += count
        return result

    def split_metadata(self, shard_stats: list[dict[str, int]], with_text: bool) -> dict[str, Any]:
        """Documents, tokens and text bytes per split, and tokens per shard (to plan packing and steps)."""
        total: collections.Counter = collections.Counter()
        for stats in shard_stats:
            total.update(stats)
        entry = {
            "num_documents": total["documents"], "num_tokens": total["tokens"], "num_empty": total["empty"],
            "tokens": [stats.get("tokens", 0) for stats in shard_stats],
            # Documents over LONG_DOCUMENT_TOKENS (convert warns) and the longest, in tokens.
            "num_long_documents": total["long_documents"],
            "longest_document_tokens": max((stats.get("max_tokens", 0) for stats in shard_stats), default=0),
            # Documents written as several records (over max_record_tokens ids): num_examples counts records.
            "num_split_documents": total["split_documents"],
        }
        if with_text:
            entry["num_text_bytes"] = total["text_bytes"]
        return entry

    def extra_metadata(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.describe(), "max_record_tokens": self.max_record_tokens}

    def write_files(self, out_dir: str) -> list[str]:
        """A SentencePiece model is copied next to the shards (temporary file + rename), so the dataset
        decodes with it after the original file moved; `describe()` names it."""
        proto = getattr(self.tokenizer, "model_proto", None)
        name = self.tokenizer.describe().get("model_file")
        if proto is None or not name:
            return []
        path = tf.io.gfile.join(out_dir, name)
        temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with tf.io.gfile.GFile(temp, "wb") as handle:
            handle.write(proto)
        tf.io.gfile.rename(temp, path, overwrite=True)
        return [name]

    def identity(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.describe(), "tokenizer_sha256": getattr(self.tokenizer, "model_sha256", None),
                "max_record_tokens": self.max_record_tokens}

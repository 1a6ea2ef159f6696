"""Text ↔ token ids for converted text datasets: byte-level (no dependency), a SentencePiece model, or a
Hugging Face `tokenizer.json` (the `tokenizers` library, an optional extra).

A dataset written by `tpu-pipeline convert --from text` records its tokenizer in metadata.json
("tokenizer"), and a SentencePiece model is copied next to it as `tokenizer.model`, so
`dataset_tokenizer(dir)` decodes the shards with exactly the vocabulary that wrote them, wherever
the original model file went. `sentencepiece` is imported only when a model is loaded: the
byte-level tokenizer and every other module work without it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.metadata import read_dataset_metadata
from tpu_pipeline.system import local_path

# ByT5's layout: ids 0, 1, 2 are pad, EOS, UNK; byte b is id b + 3. Equal to ops.token_ops.BYTE_OFFSET
# (the in-pipeline `tokenize_bytes` op), which a test asserts: format and ops never import each other.
BYTE_OFFSET = 3
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET
BYTE_SPECIAL_IDS = {"pad": 0, "eos": 1, "unk": 2}
MODEL_FILE = "tokenizer.model"  # the SentencePiece model's name inside a converted dataset
_SPM_INSTALL = "pip install 'tpu_pipeline[text]'"
HF_MODEL_FILE = "tokenizer.json"  # a Hugging Face tokenizer's name inside a converted dataset


class Tokenizer(Protocol):
    """What converting and reading text needs. `encode` is called from several threads at once."""

    name: str  # "bytes" | "sentencepiece" | "ids"
    vocab_size: int
    special_ids: dict[str, int]
    eos_id: Optional[int]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...  # drops special ids (pad/eos/bos/unk)
    def describe(self) -> dict[str, Any]: ...  # the metadata.json "tokenizer" entry


def single_id(tokenizer: Tokenizer, token: str) -> Optional[int]:
    """The id `token` encodes to when the tokenizer holds it as one token, else None (it spells it out)."""
    try:
        ids = tokenizer.encode(token)
    except DataError:
        return None
    return int(ids[0]) if len(ids) == 1 else None


def overlapping(tokens_starts: np.ndarray, token_ends: np.ndarray, weighted: np.ndarray) -> np.ndarray:
    """1 for each token whose [start, end) overlaps a weighted position of `weighted` (a 0/1 per text unit)."""
    total = np.concatenate([[0], np.cumsum(weighted, dtype=np.int64)])
    overlap = total[token_ends] - total[tokens_starts]
    point = weighted[np.minimum(tokens_starts, max(len(weighted) - 1, 0))] if len(weighted) else np.zeros_like(overlap)
    return np.where(token_ends > tokens_starts, overlap > 0, point > 0).astype(np.uint8)


def _model_file(path: str, missing: str) -> tuple[str, bytes, str]:
    """A tokenizer's model file: (path, its bytes, their sha256); `missing` is the error when there is none."""
    if not tf.io.gfile.exists(path):
        raise ConfigError(missing)
    with tf.io.gfile.GFile(path, "rb") as handle:
        data = handle.read()
    return path, data, hashlib.sha256(data).hexdigest()


class ByteTokenizer:
    """UTF-8 bytes as ids `byte + 3`: 259 ids, every string encodable, nothing to install or ship; plus, for chat
    data, its template's special tokens as ids 259, 260, ... (`added_tokens`, in the order given)."""

    name = "bytes"
    eos_id: Optional[int] = BYTE_SPECIAL_IDS["eos"]

    def __init__(self, added_tokens: Sequence[str] = ()) -> None:
        self.special_ids = dict(BYTE_SPECIAL_IDS)
        self.added_tokens = list(dict.fromkeys(added_tokens))
        self.added_ids = {token: BYTE_VOCAB_SIZE + i for i, token in enumerate(self.added_tokens)}
        self.vocab_size = BYTE_VOCAB_SIZE + len(self.added_tokens)
        ordered = sorted(self.added_tokens, key=len, reverse=True)  # "<|im_end|>" before a token it starts with
        self._split = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
            return (data.astype(np.int64) + BYTE_OFFSET).tolist()
        ids: list[int] = []
        for index, piece in enumerate(self._split.split(text)):
            if index % 2:
                ids.append(self.added_ids[piece])
            elif piece:
                ids.extend(np.frombuffer(piece.encode("utf-8"), np.uint8).astype(np.int64) + BYTE_OFFSET)
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids are dropped, added tokens written out; an id past the vocabulary becomes U+FFFD rather
        than vanishing."""
        out, data = [], bytearray()
        for i in ids:
            i = int(i)
            if i < BYTE_OFFSET:
                continue
            if BYTE_VOCAB_SIZE <= i < self.vocab_size:
                out.append(data.decode("utf-8", errors="replace"))
                out.append(self.added_tokens[i - BYTE_VOCAB_SIZE])
                data = bytearray()
                continue
            data.append(i - BYTE_OFFSET if i < BYTE_VOCAB_SIZE else 0xFF)  # 0xFF is never valid UTF-8
        return "".join(out) + data.decode("utf-8", errors="replace")

    def encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Ids of the whole text, and each id's [start, end) in UTF-8 bytes of `text` (an added token spans its bytes)."""
        raw = np.frombuffer(text.encode("utf-8"), np.uint8)
        if self._split is None:
            starts = np.arange(len(raw), dtype=np.int64)
            return (raw.astype(np.int64) + BYTE_OFFSET).tolist(), starts, starts + 1
        ids, starts, ends, at = [], [], [], 0
        for index, piece in enumerate(self._split.split(text)):
            size = len(piece.encode("utf-8"))
            if index % 2:
                ids.append(np.array([self.added_ids[piece]], np.int64))
                starts.append(np.array([at], np.int64))
                ends.append(np.array([at + size], np.int64))
            elif size:
                ids.append(raw[at:at + size].astype(np.int64) + BYTE_OFFSET)
                starts.append(np.arange(at, at + size, dtype=np.int64))
                ends.append(starts[-1] + 1)
            at += size
        if not ids:
            return [], np.empty(0, np.int64), np.empty(0, np.int64)
        return np.concatenate(ids).tolist(), np.concatenate(starts), np.concatenate(ends)

    def describe(self) -> dict[str, Any]:
        entry = {"type": "bytes", "vocab_size": self.vocab_size, "offset": BYTE_OFFSET, "special_ids": dict(self.special_ids)}
        if self.added_tokens:
            entry["added_tokens"] = dict(self.added_ids)
        return entry


class SentencePieceTokenizer:
    """A SentencePiece model (T5's, Gemma's, or one trained with `spm_train`), loaded from its bytes."""

    name = "sentencepiece"

    def __init__(self, path: str, flag: str = "--tokenizer") -> None:
        try:
            import sentencepiece
        except ImportError:
            raise ConfigError(f"{flag} spm:...: needs the sentencepiece package: {_SPM_INSTALL}") from None
        self.path, self.model_proto, self.model_sha256 = _model_file(
            path, f"{flag} spm:{path}: no such file; give the path of a SentencePiece .model file")
        try:
            self._processor = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        except Exception as error:  # the library raises RuntimeError/OSError with C++ text
            raise ConfigError(f"{flag} spm:{path}: not a SentencePiece model ({str(error).splitlines()[0]})") from None
        self.vocab_size = int(self._processor.get_piece_size())
        found = {"unk": self._processor.unk_id(), "bos": self._processor.bos_id(),
                 "eos": self._processor.eos_id(), "pad": self._processor.pad_id()}
        self.special_ids = {name: int(i) for name, i in found.items() if i >= 0}  # -1: the model has none
        self.eos_id = self.special_ids.get("eos")

    def encode(self, text: str) -> list[int]:
        return list(self._processor.encode(text, out_type=int))

    def encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Ids of the whole text, and each piece's [start, end) in UTF-8 bytes of `text`."""
        pieces = self._processor.encode(text, out_type="immutable_proto").pieces
        return ([p.id for p in pieces], np.fromiter((p.begin for p in pieces), np.int64, len(pieces)),
                np.fromiter((p.end for p in pieces), np.int64, len(pieces)))

    def decode(self, ids: Sequence[int]) -> str:
        special = set(self.special_ids.values())
        kept = [int(i) for i in ids if int(i) not in special and 0 <= int(i) < self.vocab_size]
        return self._processor.decode(kept)

    def describe(self) -> dict[str, Any]:
        return {"type": "sentencepiece", "model_file": MODEL_FILE, "vocab_size": self.vocab_size,
                "special_ids": dict(self.special_ids)}


class HuggingFaceTokenizer:
    """A Hugging Face `tokenizer.json` (Llama's, Qwen's, Gemma's, or one trained with `tokenizers`), through the
    `tokenizers` library. Its EOS is the `eos_token` of a `tokenizer_config.json` beside it, when there is one."""

    name = "huggingface"

    def __init__(self, path: str, flag: str = "--tokenizer", eos_token: Optional[str] = None) -> None:
        try:
            import tokenizers
        except ImportError:
            raise ConfigError(f"{flag} hf:...: needs the tokenizers package: {_SPM_INSTALL}") from None
        if tf.io.gfile.isdir(path):
            path = tf.io.gfile.join(path, HF_MODEL_FILE)
        self.path, self.model_proto, self.model_sha256 = _model_file(
            path, f"{flag} hf:{path}: no such file; give a Hugging Face tokenizer.json (or its folder)")
        try:
            self._tokenizer = tokenizers.Tokenizer.from_str(self.model_proto.decode("utf-8"))
        except Exception as error:  # the library raises Exception with Rust text
            raise ConfigError(f"{flag} hf:{path}: not a tokenizer.json ({str(error).splitlines()[0]})") from None
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        self.added_tokens = {token.content: int(i) for i, token in self._tokenizer.get_added_tokens_decoder().items()
                             if token.special}
        if eos_token is None:
            config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
            if "://" not in config and os.path.isfile(config):
                with open(config, encoding="utf-8") as handle:
                    value = json.load(handle).get("eos_token")
                eos_token = value.get("content") if isinstance(value, dict) else value
        self.special_ids: dict[str, int] = {}
        if eos_token:
            eos = self._tokenizer.token_to_id(eos_token)
            if eos is None:
                raise ConfigError(f"{flag} hf:{path}: its tokenizer_config.json names eos_token {eos_token!r}, which "
                                  "this tokenizer.json does not hold; give the files of one tokenizer")
            self.special_ids["eos"] = int(eos)
        self.eos_id = self.special_ids.get("eos")

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_offsets(self, text: str) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Ids of the whole text, and each token's [start, end) in characters of `text`."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        offsets = np.asarray(encoding.offsets, np.int64).reshape(-1, 2)
        return list(encoding.ids), offsets[:, 0], offsets[:, 1]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size], skip_special_tokens=True)

    def describe(self) -> dict[str, Any]:
        return {"type": "huggingface", "model_file": HF_MODEL_FILE, "vocab_size": self.vocab_size,
                "special_ids": dict(self.special_ids), "added_tokens": dict(self.added_tokens)}


class IdsTokenizer:
    """Ids converted as given (`--ids_field`): no text vocabulary, so decoding shows the ids themselves."""

    name = "ids"
    eos_id: Optional[int] = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = int(vocab_size)
        self.special_ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        raise DataError("this dataset was converted from pre-tokenized ids (--ids_field): it has no text tokenizer")

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)

    def describe(self) -> dict[str, Any]:
        return {"type": "ids", "vocab_size": self.vocab_size, "special_ids": {}}


def load_tokenizer(spec: str, flag: str = "--tokenizer") -> Tokenizer:
    """'bytes', 'spm:path/to/model' or 'hf:path/to/tokenizer.json' (local or gs://) → a tokenizer."""
    spec = spec.strip()
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("spm:") and spec[4:].strip():
        return SentencePieceTokenizer(local_path(spec[4:].strip()), flag)
    if spec.startswith("hf:") and spec[3:].strip():
        return HuggingFaceTokenizer(local_path(spec[3:].strip()), flag)
    raise ConfigError(f"{flag}: {spec!r} is not a tokenizer; give bytes, spm:path/to/sentencepiece.model or "
                      "hf:path/to/tokenizer.json")


def dataset_tokenizer(directory: str) -> Tokenizer:
    """The tokenizer a converted dataset was written with, from its metadata.json (and tokenizer.model)."""
    directory = local_path(directory)
    metadata = read_dataset_metadata(directory)
    entry = metadata.get("tokenizer")
    kind = entry.get("type") if isinstance(entry, dict) else None
    if kind == "bytes":
        added = entry.get("added_tokens") or {}
        tokenizer = ByteTokenizer(sorted(added, key=added.get))
        if (entry.get("offset", BYTE_OFFSET) != BYTE_OFFSET or entry.get("vocab_size", BYTE_VOCAB_SIZE) != tokenizer.vocab_size
                or tokenizer.added_ids != added):
            raise DataError(f"{directory}: metadata.json has a byte tokenizer with offset {entry.get('offset')}, "
                            f"vocab_size {entry.get('vocab_size')} and added tokens {added}; this version reads offset "
                            f"{BYTE_OFFSET}, vocab_size {BYTE_VOCAB_SIZE} plus the added tokens, numbered from {BYTE_VOCAB_SIZE}")
        return tokenizer
    if kind == "sentencepiece":
        model = tf.io.gfile.join(directory, entry.get("model_file") or MODEL_FILE)
        if not tf.io.gfile.exists(model):
            raise DataError(f"{directory}: metadata.json's tokenizer is {model}, which is missing; copy the "
                            "SentencePiece model there (or convert again)")
        return SentencePieceTokenizer(model, flag=f"{directory}: metadata.json tokenizer")
    if kind == "huggingface":
        model = tf.io.gfile.join(directory, entry.get("model_file") or HF_MODEL_FILE)
        if not tf.io.gfile.exists(model):
            raise DataError(f"{directory}: metadata.json's tokenizer is {model}, which is missing; copy the "
                            "tokenizer.json there (or convert again)")
        tokenizer = HuggingFaceTokenizer(model, flag=f"{directory}: metadata.json tokenizer", eos_token="")
        eos = (entry.get("special_ids") or {}).get("eos")
        if eos is not None:
            tokenizer.special_ids["eos"] = tokenizer.eos_id = int(eos)
        return tokenizer
    if kind == "ids":
        return IdsTokenizer(int(entry["vocab_size"]))
    raise DataError(f"{directory}: metadata.json has no text tokenizer (tokenizer: {entry!r}); it was not written by "
                    "`tpu-pipeline convert --from text`")

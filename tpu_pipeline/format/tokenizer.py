"""Text ↔ token ids for converted text datasets: byte-level (no dependency) or a SentencePiece model.

A dataset written by `tpu-pipeline convert --from text` records its tokenizer in metadata.json
("tokenizer"), and a SentencePiece model is copied next to it as `tokenizer.model`, so
`dataset_tokenizer(dir)` decodes the shards with exactly the vocabulary that wrote them, wherever
the original model file went. `sentencepiece` is imported only when a model is loaded: the
byte-level tokenizer and every other module work without it.
"""
from __future__ import annotations

import hashlib
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


class Tokenizer(Protocol):
    """What converting and reading text needs. `encode` is called from several threads at once."""

    name: str  # "bytes" | "sentencepiece" | "ids"
    vocab_size: int
    special_ids: dict[str, int]
    eos_id: Optional[int]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...  # drops special ids (pad/eos/bos/unk)
    def describe(self) -> dict[str, Any]: ...  # the metadata.json "tokenizer" entry


class ByteTokenizer:
    """UTF-8 bytes as ids `byte + 3`: 259 ids, every string encodable, nothing to install or ship."""

    name = "bytes"
    vocab_size = BYTE_VOCAB_SIZE
    eos_id: Optional[int] = BYTE_SPECIAL_IDS["eos"]

    def __init__(self) -> None:
        self.special_ids = dict(BYTE_SPECIAL_IDS)

    def encode(self, text: str) -> list[int]:
        data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        return (data.astype(np.int64) + BYTE_OFFSET).tolist()

    def decode(self, ids: Sequence[int]) -> str:
        """Special ids are dropped; an id past the byte range becomes U+FFFD rather than vanishing."""
        data = bytearray()
        for i in ids:
            i = int(i)
            if i < BYTE_OFFSET:
                continue
            data.append(i - BYTE_OFFSET if i < BYTE_VOCAB_SIZE else 0xFF)  # 0xFF is never valid UTF-8
        return data.decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        return {"type": "bytes", "vocab_size": self.vocab_size, "offset": BYTE_OFFSET, "special_ids": dict(self.special_ids)}


class SentencePieceTokenizer:
    """A SentencePiece model (T5's, Gemma's, or one trained with `spm_train`), loaded from its bytes."""

    name = "sentencepiece"

    def __init__(self, path: str, flag: str = "--tokenizer") -> None:
        try:
            import sentencepiece
        except ImportError:
            raise ConfigError(f"{flag} spm:...: needs the sentencepiece package: {_SPM_INSTALL}") from None
        if not tf.io.gfile.exists(path):
            raise ConfigError(f"{flag} spm:{path}: no such file; give the path of a SentencePiece .model file")
        with tf.io.gfile.GFile(path, "rb") as handle:
            self.model_proto: bytes = handle.read()
        self.path = path
        self.model_sha256 = hashlib.sha256(self.model_proto).hexdigest()
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

    def decode(self, ids: Sequence[int]) -> str:
        special = set(self.special_ids.values())
        kept = [int(i) for i in ids if int(i) not in special and 0 <= int(i) < self.vocab_size]
        return self._processor.decode(kept)

    def describe(self) -> dict[str, Any]:
        return {"type": "sentencepiece", "model_file": MODEL_FILE, "vocab_size": self.vocab_size,
                "special_ids": dict(self.special_ids)}


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
    """'bytes' or 'spm:path/to/model' (local or gs://) → a tokenizer."""
    spec = spec.strip()
    if spec == "bytes":
        return ByteTokenizer()
    if spec.startswith("spm:") and spec[4:].strip():
        return SentencePieceTokenizer(local_path(spec[4:].strip()), flag)
    raise ConfigError(f"{flag}: {spec!r} is not a tokenizer; give bytes or spm:path/to/sentencepiece.model")


def dataset_tokenizer(directory: str) -> Tokenizer:
    """The tokenizer a converted dataset was written with, from its metadata.json (and tokenizer.model)."""
    directory = local_path(directory)
    metadata = read_dataset_metadata(directory)
    entry = metadata.get("tokenizer")
    kind = entry.get("type") if isinstance(entry, dict) else None
    if kind == "bytes":
        if entry.get("offset", BYTE_OFFSET) != BYTE_OFFSET or entry.get("vocab_size", BYTE_VOCAB_SIZE) != BYTE_VOCAB_SIZE:
            raise DataError(f"{directory}: metadata.json has a byte tokenizer with offset {entry.get('offset')} and "
                            f"vocab_size {entry.get('vocab_size')}; this version reads offset {BYTE_OFFSET}, vocab_size {BYTE_VOCAB_SIZE}")
        return ByteTokenizer()
    if kind == "sentencepiece":
        model = tf.io.gfile.join(directory, entry.get("model_file") or MODEL_FILE)
        if not tf.io.gfile.exists(model):
            raise DataError(f"{directory}: metadata.json's tokenizer is {model}, which is missing; copy the "
                            "SentencePiece model there (or convert again)")
        return SentencePieceTokenizer(model, flag=f"{directory}: metadata.json tokenizer")
    if kind == "ids":
        return IdsTokenizer(int(entry["vocab_size"]))
    raise DataError(f"{directory}: metadata.json has no text tokenizer (tokenizer: {entry!r}); it was not written by "
                    "`tpu-pipeline convert --from text`")

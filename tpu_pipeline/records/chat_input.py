"""`convert --from chat`: chat and instruction data in JSON lines, Parquet (the hub's layout) or a save_to_disk
folder → `weighted_tokens` records (records/chat_records.py).

JSON lines are read as `--from text` reads them (TextSource: offsets only in memory, documents shuffled and
split by fraction, tokenized in worker threads); Parquet and save_to_disk folders as `--from parquet|hf` reads
them (TableSource: a row group per task, the hub's splits). Only how a record becomes a record differs.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Sequence, Union

import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.chat_encoding import chat_tokenizer
from tpu_pipeline.format.chat_template import ChatTemplate, load_template
from tpu_pipeline.format.tokenizer import Tokenizer
from tpu_pipeline.records.chat_records import ChatRecords, detect_schema
from tpu_pipeline.records.convert_input import Encoded, ItemError
from tpu_pipeline.records.text_input import _BOM, TextSource, expand_inputs
from tpu_pipeline.system import local_path


def table_kind(paths: Sequence[str]) -> Optional[str]:
    """'hf' for a save_to_disk folder, 'parquet' for Parquet files or a folder of them, None for JSON lines."""
    if len(paths) != 1:
        return None
    path = local_path(paths[0], absolute=True)
    if path.lower().endswith(".parquet"):
        return "parquet"
    if tf.io.gfile.isdir(path):
        if any(tf.io.gfile.exists(tf.io.gfile.join(path, name)) for name in ("dataset_dict.json", "state.json")):
            return "hf"
        for _, _, names in tf.io.gfile.walk(path):
            if any(name.lower().endswith(".parquet") for name in names):
                return "parquet"
    return None


def _first_record(files: Sequence[str]) -> tuple[dict[str, Any], str]:
    """The first non-blank JSON line of the inputs, and where it is."""
    for path in files:
        with tf.io.gfile.GFile(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                text = raw.decode("utf-8", errors="replace").removeprefix(_BOM.decode("utf-8")).strip()
                if not text:
                    continue
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as error:
                    raise DataError(f"{path}:{number}: not valid JSON ({error.msg} at column {error.colno}); JSON lines "
                                    "hold one object per line") from None
                if not isinstance(value, dict):
                    raise DataError(f"{path}:{number}: a JSON {type(value).__name__} where one object per line is expected")
                return value, f"{path}:{number}"
    raise DataError(f"chat: the inputs hold no record ({', '.join(files[:3])})")


def chat_records(template: Union[str, ChatTemplate], tokenizer: Union[str, Tokenizer], schema: str, *,
                 loss_on: str = "answers", max_tokens: int = 65_536, overlong: str = "truncate") -> ChatRecords:
    chosen = load_template(template) if isinstance(template, str) else template
    return ChatRecords(chosen, chat_tokenizer(tokenizer, chosen), schema=schema, loss_on=loss_on, max_tokens=max_tokens,
                       overlong=overlong, tokenizer_spec=tokenizer if isinstance(tokenizer, str) else "")


class ChatSource(TextSource):
    """JSON lines of conversations as a ConvertSource: one record per line, `weighted_tokens`."""

    kind = "chat"
    max_workers = 2  # mostly Python: more threads only contend for the GIL with the writer (SourceExtras)

    def __init__(self, paths: Sequence[str], *, template: Union[str, ChatTemplate] = "chatml",
                 tokenizer: Union[str, Tokenizer] = "bytes", loss_on: str = "answers", max_tokens: int = 65_536,
                 overlong: str = "truncate", splits: str = "train", seed: int = 0, shuffle: bool = True) -> None:
        files = expand_inputs([paths] if isinstance(paths, str) else paths, json_lines=True)
        first, where = _first_record(files)
        self.schema = detect_schema(list(first), where)
        self.chat = chat_records(template, tokenizer, self.schema, loss_on=loss_on, max_tokens=max_tokens,
                                 overlong=overlong)
        super().__init__(paths, splits=splits, seed=seed, shuffle=shuffle, tokenizer=self.chat.tokenizer,
                         text_field=self.schema, max_record_tokens=0)
        self.records = self.chat
        base = self.name if self.name != "text" else "chat"
        self.name = base

    @staticmethod
    def _check_flags(*_: Any) -> None:  # the chat flags are checked by ChatRecords
        return None

    def encode_batch(self, batch: list[tuple[int, bytes]]) -> list[tuple[Optional[Encoded], Optional[ItemError]]]:
        """A worker task's lines: parsed (as one JSON array when every line is an object, one C call instead of
        one per line), then encoded together (ChatRecords.encode_many)."""
        out: list[tuple[Optional[Encoded], Optional[ItemError]]] = [(None, None)] * len(batch)
        texts: list[Optional[str]] = []
        for row, item in enumerate(batch):
            try:
                text = self.text_of(item)
            except ItemError as error:
                out[row] = (None, error)
                text = None
            texts.append(text if text is not None and text.strip() else None)
            if text is not None and not text.strip():  # a blank line holds no conversation: counted as empty
                out[row] = (Encoded((), {"empty": 1}), None)
        rows = [row for row, text in enumerate(texts) if text is not None]
        try:
            values = json.loads("[" + ",".join(texts[row] for row in rows) + "]")  # type: ignore[misc]
            if len(values) != len(rows):  # a line holding "1, 2" parses as two values
                raise ValueError
        except ValueError:
            values = [None] * len(rows)  # a bad line among them: each line on its own, the bad one named
        records, wheres, kept = [], [], []
        for row, value in zip(rows, values):
            try:
                record = value if isinstance(value, dict) else self.json_object(texts[row], batch[row][0])
            except ItemError as error:
                out[row] = (None, error)
                continue
            records.append(record)
            wheres.append(self.where(batch[row][0]))
            kept.append(row)
        for row, result in zip(kept, self.chat.encode_many(records, wheres)):
            out[row] = result
        return out

    def encode(self, item: tuple[int, bytes]) -> Encoded:
        (encoded, error), = self.encode_batch([item])
        if error is not None:
            raise error
        return encoded  # type: ignore[return-value]

    def features(self) -> dict[str, dict[str, Any]]:
        return self.chat.features()

    @property
    def unit(self) -> str:
        return " conversations"

    def split_metadata(self, split: str, shard_stats: list[dict[str, int]]) -> dict[str, Any]:
        return self.chat.split_metadata(shard_stats)

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "kind": self.kind, "schema": self.schema, "tokens": self.chat.identity()}

    def describe(self) -> dict[str, Any]:
        found = super().describe()
        for key in ("document_per_line", "text_field", "ids_field"):
            found.pop(key, None)
        return {**found, "kind": self.kind, "format": "jsonl", "schema": self.schema}


def chat_source(paths: Sequence[str], *, template: Union[str, ChatTemplate] = "chatml",
                tokenizer: Union[str, Tokenizer] = "bytes", loss_on: str = "answers", max_tokens: int = 65_536,
                overlong: str = "truncate", splits: Optional[str] = None, seed: int = 0, shuffle: bool = True,
                hf_config: Optional[str] = None, shuffle_window_mb: float = 256.0) -> Any:
    """The source for --from chat: JSON lines, or a Parquet / save_to_disk dataset (its splits from its layout)."""
    kind = table_kind(paths)
    if kind is None:
        if hf_config:
            raise ConfigError("--hf_config: only for a Parquet or save_to_disk dataset")
        return ChatSource(paths, template=template, tokenizer=tokenizer, loss_on=loss_on, max_tokens=max_tokens,
                          overlong=overlong, splits=splits or "train", seed=seed, shuffle=shuffle)
    from tpu_pipeline.records.table_input import TableSource

    def records_of(schema: str) -> ChatRecords:
        return chat_records(template, tokenizer, schema, loss_on=loss_on, max_tokens=max_tokens, overlong=overlong)

    return TableSource(paths[0], kind=kind, config=hf_config, splits=splits, seed=seed, shuffle=shuffle,
                       shuffle_window_mb=shuffle_window_mb, chat=records_of)



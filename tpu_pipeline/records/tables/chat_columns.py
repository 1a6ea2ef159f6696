"""The columns of a chat set in a Parquet or save_to_disk dataset (`convert --from chat`), one piece's rows
encoded as `weighted_tokens` records (each token 2 * id + its loss weight).

The schema's columns (`messages`, or `prompt`/`completion`, or `question`/`answer`) are read as Python
values (a `messages` column is a list of structs) and each row goes through the same `ChatRecords` as a JSON
line, so the two inputs give the same records for the same conversation; with ChatML and the byte-level
tokenizer the columns are read from their Arrow buffers instead (records/chat_flat.py, the same records).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import pyarrow as pa

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.records.chat_records import SCHEMAS, ChatRecords
from tpu_pipeline.records.tables.columns import Result
from tpu_pipeline.records.tables.files import TableFiles


class ChatColumns:
    """What TableSource needs of its columns, for a chat schema."""

    text_field = ids_field = image_field = label_field = None
    class_names: Optional[list[str]] = None

    def __init__(self, records: ChatRecords) -> None:
        self.records = records
        self.names = list(SCHEMAS[records.schema])
        self.keep_fields: list[str] = []

    def check(self, files: TableFiles) -> None:
        for entry in files.files:
            missing = [c for c in self.names if c not in entry.schema.names]
            if missing:
                raise ConfigError(f"{files.kind}: {entry.relative} has no column(s) {missing}, which the first file's "
                                  f"{self.records.schema} schema needs; its columns: {', '.join(entry.schema.names)}")

    def find_class_names(self, files: TableFiles, given: Optional[Sequence[str]], hf_features: Any) -> None:
        if given:
            raise ConfigError("--class_names: not with --from chat")

    def features(self) -> dict[str, dict[str, Any]]:
        return self.records.features()

    def encode(self, table: pa.Table, where: list[str]) -> list[Result]:
        if self.records.flat is not None:  # ChatML, byte-level: from the Arrow buffers (records/chat_flat.py)
            return self.records.flat.encode_table(table, where)
        return self.records.encode_many(table.select(self.names).to_pylist(), where)  # type: ignore[return-value]

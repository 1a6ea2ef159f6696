"""DatasetInfo: what a source knows about its data before reading it."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Example count (all input pipelines together), class names and features; None where unknown
    (e.g. a bare glob of files, whose size only a full read would tell)."""

    num_examples: Optional[int]
    class_names: Optional[list[str]]
    features: dict[str, Any]
    tokenizer: Optional[dict[str, Any]] = None  # a converted text dataset's metadata.json "tokenizer" entry

    @property
    def vocab_size(self) -> Optional[int]:
        """The token vocabulary (a language model's logits width), when the data was tokenized by convert."""
        return int(self.tokenizer["vocab_size"]) if self.tokenizer and self.tokenizer.get("vocab_size") else None

    @property
    def byte_offset(self) -> Optional[int]:
        """The id of byte 0 for byte-level token ids (bits per byte can then be counted), else None."""
        return int(self.tokenizer.get("offset", 3)) if self.tokenizer and self.tokenizer.get("type") == "bytes" else None

    @property
    def num_classes(self) -> Optional[int]:
        return len(self.class_names) if self.class_names else None

"""The `data.sequence` section: variable-length token features into static TPU shapes.

    sequence: {keys: [inputs, targets], length: 1024, mode: pack}

Three modes, one section (the plan says which stages follow from it, and why):

- pad: each example truncated or padded to `length` (a `<key>_mask` marks real tokens); simplest,
  and wasteful when lengths vary.
- bucket: examples grouped by length into `boundaries`; every global batch comes from one bucket,
  so each step has one static shape per bucket (one XLA compile each).
- pack: several examples per row of `length`, with `<key>_segment_ids` (1, 2, ...; 0 = padding) and
  `<key>_positions` (0-based per example), so attention never crosses examples.

Token id 0 is a real token: padding is carried by masks and segment ids, never by value.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.errors import ConfigError

class SequenceConfig(StrictModel):
    """data.sequence: how variable-length keys become static `[batch, length]` tensors."""

    keys: list[str] = pydantic.Field(
        description="the variable-length features to pad, bucket or pack together (e.g. [inputs, targets]); "
        "in pack mode every other feature is refused (a packed row has no place for it)"
    )
    length: Union[pydantic.PositiveInt, dict[str, pydantic.PositiveInt]] = pydantic.Field(
        description="tokens per row: one number for every key, or {key: length} (T5-style inputs/targets); "
        "a multiple of 128 suits the TPU's tiling"
    )
    mode: Literal["pad", "bucket", "pack"] = pydantic.Field(
        "pack", description="pad: one example per row, padded; bucket: batches of similar lengths; "
        "pack: several examples per row (the densest)"
    )
    overflow: Literal["auto", "error", "truncate", "split"] = pydantic.Field(
        "auto", description="an example longer than length: error (one line naming the key and lengths), "
        "truncate (keep the head), split (pack mode: chunks of length, each its own segment); auto: split in pack "
        "mode (nothing is lost), truncate in pad and bucket modes (one example per row: the head), so changing the "
        "mode is one key; convert and doctor count the documents far longer than a row"
    )
    boundaries: Optional[list[pydantic.PositiveInt]] = pydantic.Field(
        None, description="bucket mode: increasing bucket lengths; the last is at most length (added if missing)"
    )
    bucket_batch: Literal["examples", "tokens"] = pydantic.Field(
        "examples", description="bucket mode: examples = batch_size examples per step in every bucket; tokens = "
        "batch_size × length / bucket length (rounded down to a multiple of 8), so tokens per step stay near constant"
    )
    window: Union[pydantic.PositiveInt, Literal["auto"]] = pydantic.Field(
        "auto", description="pack and bucket modes: items placed together (and resumed from) as one unit — pack: "
        "chunks of at most length tokens (a longer document is cut first, so a window holds at most window × length "
        "tokens); bucket: examples, each cut to length first; larger packs denser and costs more memory and a longer "
        "replay on resume; auto: pack 1024 items up to length 1024, fewer (at least 256) for longer rows, so a window "
        "holds ~1M tokens at most; bucket 32 global batches"
    )
    row_shuffle: Union[pydantic.PositiveInt, bool, Literal["auto"]] = pydantic.Field(
        "auto", description="pack mode: the packed rows of this many consecutive windows leave in a seeded "
        "permutation, so a long document's chunks land in many batches (a resume rebuilds the pool; nothing of it "
        "is saved); auto: windows adding up to ~2M tokens when data.shuffle is on, off when it is off; false: rows "
        "in packing order"
    )
    algorithm: Literal["first_fit_decreasing", "best_fit_decreasing", "first_fit"] = pydantic.Field(
        "first_fit_decreasing", description="pack mode: how a window's examples are placed in rows"
    )

    @pydantic.model_validator(mode="after")
    def _check(self, info: pydantic.ValidationInfo) -> "SequenceConfig":
        prefix = (info.context or {}).get("prefix", "data") + ".sequence"
        if not self.keys:
            raise ConfigError(f"{prefix}.keys: name the variable-length features, e.g. [inputs, targets]")
        if len(set(self.keys)) != len(self.keys):
            raise ConfigError(f"{prefix}.keys: {self.keys} names a feature twice")
        if isinstance(self.length, dict):
            missing, extra = set(self.keys) - set(self.length), set(self.length) - set(self.keys)
            if missing or extra:
                raise ConfigError(f"{prefix}.length: give a length for each of keys {self.keys} "
                                  f"(missing {sorted(missing)}, not in keys {sorted(extra)}); or one number for all")
        if self.overflow == "split" and self.mode != "pack":
            raise ConfigError(f"{prefix}.overflow=split: splitting long examples into chunks needs mode: pack; "
                              "use truncate or error")
        if self.boundaries is not None:
            if self.mode != "bucket":
                raise ConfigError(f"{prefix}.boundaries: only with mode: bucket")
            if sorted(set(self.boundaries)) != self.boundaries:
                raise ConfigError(f"{prefix}.boundaries: {self.boundaries} must increase, e.g. [128, 256, 512, 1024]")
            if self.boundaries[-1] > self.max_length:
                raise ConfigError(f"{prefix}.boundaries: {self.boundaries[-1]} is over length {self.max_length}; "
                                  "the longest bucket is length itself")
            if isinstance(self.length, dict) and len(set(self.length.values())) > 1:
                raise ConfigError(f"{prefix}.boundaries: bucket mode takes one length for every key")
        if self.row_shuffle not in ("auto", False) and self.mode != "pack":
            raise ConfigError(f"{prefix}.row_shuffle: only with mode: pack (it permutes packed rows)")
        if self.bucket_batch == "tokens" and self.mode != "bucket":
            raise ConfigError(f"{prefix}.bucket_batch: only with mode: bucket")
        return self

    def resolved_overflow(self) -> str:
        """overflow with auto resolved: split (pack), truncate (pad, bucket)."""
        if self.overflow != "auto":
            return self.overflow
        return "split" if self.mode == "pack" else "truncate"

    def lengths(self) -> dict[str, int]:
        """{key: length} for every key."""
        if isinstance(self.length, dict):
            return {key: int(self.length[key]) for key in self.keys}
        return {key: int(self.length) for key in self.keys}

    @property
    def max_length(self) -> int:
        return max(self.lengths().values())

"""A feature to parse (`data.features`) and a preprocessing op (`data.preprocess`): shared by the data
section and each source of a mixture."""
from __future__ import annotations

from typing import Any, Literal, Optional

import pydantic

from tpu_pipeline.config.base import StrictModel

SEQUENCE_KINDS = ("ragged", "sequence")  # kinds parsed as a variable-length sequence per example


class FeatureConfig(StrictModel):
    """One tf.Example feature: FixedLenFeature ('fixed'), VarLenFeature densified ('var'), a variable-length
    1-D vector ('ragged'), or a SequenceExample feature list ('sequence')."""

    dtype: Literal["string", "int64", "float32"]
    shape: list[pydantic.NonNegativeInt] = []
    kind: Literal["fixed", "var", "ragged", "sequence"] = pydantic.Field(
        "fixed", description="fixed: exactly `shape` values; var: any count, densified and padded with `default`; "
        "ragged: any count, kept as a 1-D tensor of the example's length (token ids; shape must be []); "
        "sequence: a tf.SequenceExample feature list, [steps, *shape] per example (any feature of kind sequence "
        "makes every record a SequenceExample, whose context holds the other features)"
    )
    default: Any = pydantic.Field(
        None, description="fixed: the value of an absent feature; var: the padding value; ragged and sequence: "
        "only [] (an absent feature is an empty sequence, not a fault)"
    )
    cast: Optional[Literal["int32", "int64"]] = pydantic.Field(
        None, description="ragged and sequence int64 features: the dtype they arrive as; unset: int32 (what TPUs "
        "take, half the bytes; an id outside int32 is an error, never wrapped); int64: as stored"
    )

    @pydantic.model_validator(mode="after")
    def _sequence_rules(self) -> "FeatureConfig":
        if self.kind == "ragged" and self.shape:
            raise ValueError(f"kind ragged is one 1-D vector of any length per example, so shape must be [] "
                             f"(given {self.shape}); use kind var or fixed for other shapes")
        if self.kind in SEQUENCE_KINDS and self.default not in (None, []):
            raise ValueError(f"kind {self.kind} takes only default: [] (an absent feature is then an empty "
                             f"sequence), given {self.default!r}; append or prepend ids with ops")
        if self.cast is not None and (self.kind not in SEQUENCE_KINDS or self.dtype != "int64"):
            raise ValueError(f"cast applies to int64 features of kind ragged or sequence (this one is {self.dtype}, "
                             f"kind {self.kind}); cast others with the op cast")
        return self

    @property
    def parsed_dtype(self) -> str:
        """The dtype the parsed feature has: `dtype`, but int32 for int64 ragged and sequence features
        unless `cast: int64`."""
        if self.cast is not None:
            return self.cast
        if self.kind in SEQUENCE_KINDS and self.dtype == "int64":
            return self.cast or "int32"
        return self.dtype


class OpConfig(StrictModel):
    """One preprocessing op by registry name, with its keyword arguments."""

    op: str
    args: dict[str, Any] = {}

    @pydantic.model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        # Accept "random_flip" and {op: resize, size: 224} as well as {op:..., args: {...}}.
        if isinstance(value, str):
            return {"op": value}
        if isinstance(value, dict) and "op" in value and "args" not in value:
            return {"op": value["op"], "args": {k: v for k, v in value.items() if k != "op"}}
        return value

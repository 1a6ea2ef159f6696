"""The `data.mixture` section: several sources mixed at set rates (docs/mixtures.md).

It replaces `data.source`. Each entry names a source, its weight, what happens when it runs out
(`exhausted`), and optionally features and preprocess ops of its own, which run before the mixing
(so sources with different fields can be brought to one shape); everything else in `data` applies
to the mixed stream.
"""
from __future__ import annotations

from typing import Any, Literal

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.features import FeatureConfig, OpConfig
from tpu_pipeline.config.sources import TFRecordSourceConfig
from tpu_pipeline.errors import ConfigError


class MixtureEntry(StrictModel):
    """One source of a mixture."""

    name: str = pydantic.Field(pattern=r"^[A-Za-z0-9_.-]+$", description="how figures and logs name it; unique")
    weight: float = pydantic.Field(description="its share of the mixture (weights are normalized; 0 leaves it out)")
    source: TFRecordSourceConfig = pydantic.Field(description="its records (tfrecord: files or a converted dir)")
    features: dict[str, FeatureConfig] = pydantic.Field(
        {}, description="its own feature spec, when its records differ: they are parsed with it instead of "
        "data.features")
    preprocess: list[OpConfig] = pydantic.Field(
        [], description="deterministic ops on its examples only, before the mixing (e.g. truncate one corpus, or "
        "rename a field so every source comes out with the same features)")
    exhausted: Literal["repeat", "drop", "stop"] = pydantic.Field(
        "repeat", description="at its end: repeat (its next epoch, in a new order), drop (it leaves; the others' "
        "weights are renormalized), stop (the mixture ends: for evaluation)")


class MixtureConfig(StrictModel):
    """`data.mixture`: the sources and how their weights count."""

    weight_by: Literal["examples", "tokens"] = pydantic.Field(
        "examples", description="examples: the weights are shares of examples; tokens: of tokens (each source's "
        "example rate divided by its mean tokens per example, measured on its first records)")
    sources: list[MixtureEntry] = pydantic.Field(min_length=1)

    @pydantic.model_validator(mode="before")
    @classmethod
    def _sources_listed(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        prefix = f"{(info.context or {}).get('prefix', 'data')}.mixture"
        if isinstance(value, dict) and not value.get("sources"):
            raise ConfigError(f"{prefix}.sources: list the sources to mix, e.g. "
                              "[{name: web, weight: 0.7, source: {dir: data/web}}, {name: code, weight: 0.3, ...}]")
        return value

    @pydantic.model_validator(mode="after")
    def _check(self, info: pydantic.ValidationInfo) -> "MixtureConfig":
        prefix = f"{(info.context or {}).get('prefix', 'data')}.mixture"
        seen: set[str] = set()
        for index, entry in enumerate(self.sources):
            where = f"{prefix}.sources[{index}] ({entry.name})"
            if entry.name in seen:
                raise ConfigError(f"{where}.name: {entry.name!r} is used twice; give each source its own name")
            seen.add(entry.name)
            if not entry.weight >= 0 or entry.weight == float("inf"):
                raise ConfigError(f"{where}.weight: {entry.weight} must be a finite number >= 0")
        if not sum(entry.weight for entry in self.sources) > 0:
            raise ConfigError(f"{prefix}: every weight is 0; give at least one source a positive weight")
        return self

    @property
    def names(self) -> list[str]:
        return [entry.name for entry in self.sources]

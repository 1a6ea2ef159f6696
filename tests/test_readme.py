"""The config reference (docs/config.md, linked from the README) must name every key the schema accepts
and every built-in op."""
from __future__ import annotations

import os
import re

import pytest
import pydantic

from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.config.train import TrainConfig
from tpu_pipeline.ops import registered_ops

pytestmark = pytest.mark.tf_independent

CONFIG_REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "config.md")


def keys(model: type[pydantic.BaseModel], prefix: str) -> set[str]:
    found = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        members = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type) and issubclass(a, pydantic.BaseModel)]
        if members and name not in ("outputs", "features") and not (name in ("preprocess", "augment")):
            for member in members:
                found |= keys(member, f"{prefix}.{name}")
        else:
            found.add(f"{prefix}.{name}")
    return found


def test_every_data_key_is_documented():
    text = open(CONFIG_REFERENCE).read()
    documented = set(re.findall(r"`(data\.[a-z_.]+)`", text))
    assert keys(DataConfig, "data") <= documented, sorted(keys(DataConfig, "data") - documented)


def test_every_cluster_model_and_train_key_is_documented():
    text = open(CONFIG_REFERENCE).read()
    documented = set(re.findall(r"`((?:cluster|model|train)\.[a-z_0-9.]+)`", text))
    for model, prefix in [(ClusterConfig, "cluster"), (ModelConfig, "model"), (TrainConfig, "train")]:
        expected = keys(model, prefix)
        assert expected <= documented, sorted(expected - documented)


def test_every_builtin_op_is_documented():
    text = open(CONFIG_REFERENCE).read()
    builtin = {op for op in registered_ops() if not op.endswith("_test") and not op.endswith("_test_op")}
    missing = [op for op in builtin if f"| `{op}`" not in text]
    assert not missing, missing

"""The plan: each decision made once, in one module, with its reason; read by builder, bench and doctor."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline import ArraySource, Pipeline, Plan

from helpers import plan_of, small_config, write_small_shards

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "tpu_pipeline")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    return write_small_shards(tmp_path_factory.mktemp("small"), 512, num_shards=4)[0]


def test_every_decision_has_a_value_and_a_reason(shards):
    plan = plan_of(config_from_dict({"data": small_config(shards, repeat="forever")}).data)
    assert (plan.parse.value, plan.shuffle.value, plan.record_block.value, plan.record_cache.value, plan.order.value) == (
        "batched", "window", 256, True, True)
    assert set(plan.features.value) == {"features", "label", "id"} and len(plan.files.value) == 4
    assert plan.read.record_block == 256 and plan.read.keep_blocks and plan.read.cache_records and plan.read.seed == 3
    explained = plan.explain().splitlines()
    assert [line.split()[0] for line in explained] == list(Plan.DECISIONS)
    assert all(getattr(plan, name).reason for name in Plan.DECISIONS)
    assert "every op works on whole batches" in plan.parse.reason
    assert set(plan.as_dict()) == set(Plan.DECISIONS)


def test_whether_to_parse_is_the_sources_property_not_a_faked_config(shards):
    config = config_from_dict({"data": small_config(shards)}).data  # a tfrecord config...
    arrays = ArraySource({"features": np.zeros((8, 16), np.float32), "label": np.zeros(8, np.int64),
                          "id": np.arange(8)})
    pipeline = Pipeline.from_config(config, source=arrays)  # ...read from finished arrays: nothing to parse
    assert pipeline.plan.parse.value == "none" and pipeline.plan.features.value == {}
    assert pipeline.plan.record_cache.value is False and pipeline.plan.files.value == ()
    assert sorted(int(i) for batch in pipeline.build() for i in batch["id"].numpy()) == list(range(8))


def test_batched_parse_cannot_cache_parsed_examples(shards):
    config = config_from_dict({"data": small_config(shards, parse="batched", cache={"enabled": True})}).data
    with pytest.raises(ConfigError, match=r"data.parse=batched .* data.cache.enabled"):
        plan_of(config)


def test_eval_data_errors_name_their_own_section(shards):
    config = config_from_dict({"eval_data": small_config(shards, shuffle={"mode": "window"}, parse="per_example")})
    with pytest.raises(ConfigError, match=r"^eval_data.shuffle.mode=window"):
        Pipeline.from_config(config.eval_data, prefix="eval_data")


# The config keys each decision reads. Outside the plan (and the config that declares them), a
# module may name a key in a message or a proposed fix, but never read it to decide.
DECISION_READS = re.compile(
    r"config\.(parse|cache\.records|shuffle\.mode|options\.deterministic)\b|(?<!data\.)source\.record_batch|\.batchable\b"
)


def test_each_decision_is_made_in_one_module():
    offenders = []
    for folder, _, names in os.walk(PACKAGE):
        for name in names:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE)
            if not name.endswith(".py") or relative in ("pipeline/plan.py", "config/data.py") or relative.startswith("ops/"):
                continue
            for number, line in enumerate(open(path), start=1):
                if DECISION_READS.search(line):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "decisions made outside pipeline/plan.py:\n" + "\n".join(offenders)


def test_demo_explain_prints_the_plan(shards, tmp_path):
    config_path = tmp_path / "small.yaml"
    config_path.write_text(yaml.safe_dump({"data": small_config(shards, repeat="forever")}))
    result = subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", "demo", "--config", str(config_path), "--explain",
         "--steps", "2", "--warmup", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "plan (what the pipeline decided, and why):" in result.stdout
    for name in Plan.DECISIONS:
        assert re.search(rf"^\s+{name}\s+\S", result.stdout, re.M), result.stdout
    assert "throughput:" in result.stdout

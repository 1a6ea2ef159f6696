"""Defaults one config section takes from another, and settings that cannot feed one model refused
before the first step: data.outputs from data.sequence and train.task, eval_data.sequence from
data.sequence, and an evaluation whose shapes the trained model cannot take."""
from __future__ import annotations

import copy
import os

import pytest

from tpu_pipeline.config import config_from_dict, load_config
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.config.schema import Config
from tpu_pipeline.config.train import TrainConfig
from tpu_pipeline.errors import ConfigError

from test_text_lm import converted, lm_config

pytestmark = pytest.mark.tf_independent

TEXT_LM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "text_lm.yaml")

PACK = {"inputs": ["inputs", "inputs_segment_ids", "inputs_positions"], "targets": "targets",
        "weights": "targets_segment_ids"}
PAD = {"inputs": ["inputs", "inputs_mask"], "targets": "targets", "weights": "targets_mask"}
BUCKET = {"inputs": ["inputs", "inputs_mask"], "targets": "targets", "weights": ["example_mask", "targets_mask"]}


def outputs(config: Config, section: str = "data"):
    value = getattr(config, section).outputs
    return None if value is None else value.model_dump()


def without_outputs(raw: dict) -> dict:
    raw = copy.deepcopy(raw)
    for section in ("data", "eval_data"):
        if section in raw:
            raw[section].pop("outputs", None)
    return raw


@pytest.mark.parametrize("overrides, expected", [
    ([], PACK),
    (["data.sequence.mode=pad", "data.sequence.overflow=truncate"], PAD),
    (["data.sequence.mode=bucket", "data.sequence.overflow=truncate"], BUCKET),
])
def test_a_language_models_outputs_follow_the_sequence_mode(overrides, expected):
    config = load_config(TEXT_LM, overrides)
    assert outputs(config) == expected
    assert outputs(config, "eval_data") == expected  # eval_data's sequence follows data's, and so do its outputs


def test_the_shipped_text_config_switches_to_pad_with_the_mode_alone_where_its_documents_fit():
    # text_lm.yaml splits long documents (pack only); a config that does not is switched by one key.
    raw = without_outputs(lm_config("/data", "/run"))
    for section in ("data", "eval_data"):
        del raw[section]["sequence"]["overflow"], raw[section]["sequence"]["window"]
    del raw["eval_data"]["sequence"]
    raw["data"]["sequence"]["mode"] = "pad"
    config = config_from_dict(raw)
    assert outputs(config) == outputs(config, "eval_data") == PAD
    assert config.eval_data.sequence.mode == "pad" and config.eval_data.sequence.length == 64


@pytest.mark.parametrize("mode, overflow", [("pack", "split"), ("pad", "truncate"), ("bucket", "truncate")])
def test_the_shipped_text_config_takes_each_mode_with_one_override(mode, overflow):
    """configs/text_lm.yaml's documents are longer than a row: overflow auto splits them in pack mode and
    keeps their heads in pad and bucket modes, so the mode is the only key to change (the plan says so)."""
    from tpu_pipeline.pipeline.plan import make_plan
    from tpu_pipeline.pipeline.sources.arrays import ArraySource

    config = load_config(TEXT_LM, [f"data.sequence.mode={mode}"])
    assert config.data.sequence.overflow == "auto" and config.data.sequence.resolved_overflow() == overflow
    assert config.eval_data.sequence.resolved_overflow() == overflow
    assert outputs(config) == {"pack": PACK, "pad": PAD, "bucket": BUCKET}[mode]
    plan = make_plan(config.data, ArraySource({"tokens": [[1, 2, 3]]}))
    assert plan.sequence.value.overflow == overflow and "(overflow auto)" in plan.sequence.reason


def test_an_explicit_overflow_is_kept_and_split_is_refused_outside_pack():
    config = load_config(TEXT_LM, ["data.sequence.mode=pad", "data.sequence.overflow=error"])
    assert config.data.sequence.resolved_overflow() == "error"
    with pytest.raises(ConfigError, match="overflow=split"):
        load_config(TEXT_LM, ["data.sequence.mode=pad", "data.sequence.overflow=split"])


def test_explicit_outputs_win_and_null_means_none():
    raw = lm_config("/data", "/run")
    raw["data"]["outputs"] = {"inputs": ["inputs", "inputs_segment_ids"], "targets": "targets"}
    raw["eval_data"]["outputs"] = None
    config = config_from_dict(raw)
    assert outputs(config) == {"inputs": ["inputs", "inputs_segment_ids"], "targets": "targets", "weights": None}
    assert config.eval_data.outputs is None


def test_no_outputs_are_guessed_for_a_classifier_or_a_single_key():
    raw = without_outputs(lm_config("/data", "/run"))
    raw["train"]["task"] = "classification"
    assert config_from_dict(raw).data.outputs is None  # the label's name is the user's to give
    raw["train"]["task"] = "language_model"
    raw["data"]["sequence"]["keys"] = ["tokens"]
    raw["data"]["preprocess"] = []
    raw["data"]["sequence"]["length"] = 64
    assert config_from_dict(raw).data.outputs is None


def test_a_data_config_built_in_python_is_not_changed_by_the_config_that_holds_it():
    data = DataConfig.model_validate(without_outputs(lm_config("/data", "/run"))["data"])
    config = Config(data=data, train=TrainConfig(task="language_model"))
    assert outputs(config) == PACK and data.outputs is None


@pytest.mark.parametrize("given, expected", [
    ({}, {"keys": ["inputs", "targets"], "length": 128, "mode": "pack", "overflow": "split"}),  # no eval sequence
    ({"sequence": {"length": 64}}, {"keys": ["inputs", "targets"], "length": 64, "mode": "pack", "overflow": "split"}),
    ({"sequence": {"length": None}}, {"keys": ["inputs", "targets"], "length": 128, "mode": "pack", "overflow": "split"}),
    # another mode: only keys and length follow (overflow: split is pack's alone; auto truncates in pad mode)
    ({"sequence": {"mode": "pad"}}, {"keys": ["inputs", "targets"], "length": 128, "mode": "pad", "overflow": "auto"}),
])
def test_eval_data_sequence_follows_data_sequence_where_it_sets_nothing(given, expected):
    raw = without_outputs(lm_config("/data", "/run", length=128))
    del raw["eval_data"]["sequence"]
    raw["eval_data"].update(given)
    sequence = config_from_dict(raw).eval_data.sequence
    assert {key: getattr(sequence, key) for key in expected} == expected


def test_eval_data_sequence_null_keeps_evaluation_without_one():
    raw = without_outputs(lm_config("/data", "/run"))
    raw["eval_data"]["sequence"] = None
    assert config_from_dict(raw).eval_data.sequence is None


def test_changing_only_the_training_length_changes_the_evaluations_too(tmp_path):
    """The issue's first-hour failure: data.sequence.length=128 alone trained an epoch, then the
    evaluation (still 256) died in a 46-line trace. Now both follow, and training runs."""
    from tpu_pipeline.train import train

    raw = without_outputs(lm_config(converted(tmp_path, count=120), str(tmp_path / "run"), epochs=1, steps=2))
    raw["cluster"] = {"cpu_replicas": 1}  # lengths are the point: 1 replica traces far faster than 8
    del raw["eval_data"]["sequence"]
    raw["data"]["sequence"]["length"] = 32
    metrics = train(config_from_dict(raw), printer=lambda line: None)
    assert metrics["steps"] == 2 and metrics["eval_loss"] is not None


def test_an_evaluation_the_model_cannot_take_is_refused_before_the_first_step(tmp_path):
    from tpu_pipeline.train import train

    raw = lm_config(converted(tmp_path, count=120), str(tmp_path / "run"), epochs=1, steps=2)
    raw["data"]["sequence"]["length"] = 32  # eval_data.sequence.length stays 64, set explicitly
    lines: list[str] = []
    with pytest.raises(ConfigError) as raised:
        train(config_from_dict(raw), printer=lines.append)
    assert str(raised.value) == (
        "eval_data.sequence.length=64: the model trained on data.sequence.length=32 takes its input 'inputs' of "
        "shape [32], not [64]; remove eval_data.sequence.length (it follows data.sequence.length) or make the two equal")
    assert not any(line.startswith(("step ", "epoch ", "saved checkpoint")) for line in lines), lines

    raw = lm_config(converted(tmp_path / "b", count=120), str(tmp_path / "run_b"), epochs=1, steps=2)
    raw["eval_data"]["sequence"].update(mode="pad", overflow="truncate", window="auto")
    del raw["eval_data"]["outputs"]  # derived for pad: inputs and inputs_mask, which the packed model does not take
    with pytest.raises(ConfigError, match=r"^eval_data\.outputs\.inputs: evaluation gives the inputs \['inputs', "
                                          r"'inputs_mask'\], and the model trained on data takes \['inputs', "
                                          r"'inputs_positions', 'inputs_segment_ids'\]; leave eval_data\.outputs"):
        train(config_from_dict(raw), printer=lambda line: None)


def test_derived_outputs_are_shown_resolved_but_not_as_set():
    """`tpu-pipeline config` prints what train runs; `--set_only` prints a file to take back, where derived
    outputs must stay derived (a later change of mode must change them)."""
    config = load_config(TEXT_LM)
    assert config.model_dump()["data"]["outputs"] == PACK
    assert "outputs" not in config.model_dump(exclude_unset=True)["data"]
    again = load_config(TEXT_LM, ["data.sequence.mode=pad", "data.sequence.overflow=truncate"])
    assert outputs(again) == PAD


def test_what_eval_data_takes_from_data_sequence_is_not_shown_as_set():
    set_only = load_config(TEXT_LM, ["eval_data.sequence.overflow=split"]).model_dump(exclude_unset=True)
    assert set_only["eval_data"]["sequence"] == {"overflow": "split"}
    assert "sequence" not in load_config(TEXT_LM).model_dump(exclude_unset=True)["eval_data"]
    assert load_config(TEXT_LM).model_dump()["eval_data"]["sequence"]["length"] == 256  # resolved: followed

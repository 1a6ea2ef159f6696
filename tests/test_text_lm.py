"""Language models through `train`: text converted by `convert --from text`, packed rows, a Transformer.

What a user sees (the epoch line, metrics.json), what a language model must get right (padding changes
no loss or metric, the loss falls), and that a SIGKILLed run continues exactly: the same documents
at the same steps as a run never interrupted.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.records.convert import ConvertOptions, convert
from tpu_pipeline.records.text_input import TextSource

pytestmark = pytest.mark.tf_builds

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORDS = "the of a TPU packs rows tokens and into attention segment model data pipeline resume exact".split()


def write_corpus(directory, count: int, seed: int = 0) -> str:
    """`count` documents as JSON lines, each starting with its number in 5 digits; returns the file."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "corpus.jsonl")
    with open(path, "w") as handle:
        for index in range(count):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14)))
            handle.write(json.dumps({"text": f"{index:05d} {words}."}) + "\n")
    return path


def converted(tmp_path, count: int = 300, splits: str = "train=0.9,validation=0.1") -> str:
    out = str(tmp_path / "corpus")
    convert(TextSource([write_corpus(tmp_path / "text", count)], splits=splits, text_field="text"), out,
            ConvertOptions(min_shards=2, progress=False))
    return out


def lm_config(data_dir: str, run_dir: str, *, length: int = 64, epochs: int = 2, steps: int = 6,
              eval_data: bool = True, **train: object) -> dict:
    def section(split: str, evaluation: bool) -> dict:
        return {
            "source": {"type": "tfrecord", "dir": data_dir, "split": split},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "preprocess": [{"op": "lm_shift", "key": "tokens"}],
            "sequence": {"keys": ["inputs", "targets"], "length": length, "mode": "pack", "overflow": "split",
                         "window": 64},
            "shuffle": {"enabled": False} if evaluation else {"buffer_size": 256},
            "repeat": 1 if evaluation else "forever",
            "batch_size": 8,
            "outputs": {"inputs": ["inputs", "inputs_segment_ids", "inputs_positions"], "targets": "targets",
                        "weights": "targets_segment_ids"},
            "seed": 3,
        }

    return {
        "data": section("train", False),
        **({"eval_data": section("validation", True)} if eval_data else {}),
        "cluster": {"cpu_replicas": 8},
        "model": {"architecture": "transformer",
                  "transformer": {"width": 32, "depth": 1, "heads": 2, "mlp_dim": 64},
                  "optimizer": {"name": "adam"}, "schedule": {"name": "constant", "learning_rate": 0.003}},
        "train": {"task": "language_model", "run_dir": run_dir, "epochs": epochs, "steps_per_epoch": steps,
                  "tensorboard": False, "log_every_steps": 3, **train},
    }


def test_train_prints_and_writes_the_language_model_figures(tmp_path, capsys):
    from tpu_pipeline.train import train

    config = config_from_dict(lm_config(converted(tmp_path), str(tmp_path / "run")))
    lines: list[str] = []
    metrics = train(config, printer=lines.append)
    epoch_lines = [line for line in lines if line.startswith("epoch ")]
    assert len(epoch_lines) == 2, lines
    for field in ("loss", "token_accuracy", "perplexity", "bits_per_byte", "val_loss", "val_perplexity",
                  "val_bits_per_byte", "tokens/s", "non-padding", "waiting for input"):
        assert field in epoch_lines[-1], (field, epoch_lines[-1])
    for key in ("loss", "token_accuracy", "perplexity", "bits_per_byte", "tokens_per_sec", "non_padding_fraction",
                "input_wait_fraction", "eval_loss", "eval_token_accuracy", "eval_perplexity", "eval_bits_per_byte"):
        assert metrics.get(key) is not None, (key, metrics)
    assert metrics == json.load(open(tmp_path / "run" / "metrics.json"))
    # perplexity and bits per byte are the mean cross-entropy per token, in other units
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]), rel=1e-4)
    assert 0.5 < metrics["non_padding_fraction"] <= 1.0


def test_a_language_model_without_token_weights_is_refused_in_one_line(tmp_path):
    from tpu_pipeline.train import train

    raw = lm_config(converted(tmp_path), str(tmp_path / "run"), eval_data=False)
    del raw["data"]["outputs"]["weights"]
    with pytest.raises(ConfigError, match=r"data\.outputs\.weights: .*set data\.outputs\.weights: targets_segment_ids"):
        train(config_from_dict(raw), printer=lambda line: None)


def test_padding_changes_no_loss_or_metric_of_a_compiled_language_model():
    """Values in the padding (segment 0, weight 0) are garbage by contract: the compiled loss and
    every metric must not see them."""
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model import build_model

    config = ModelConfig.from_dict({"architecture": "transformer", "optimizer": {"name": "adam"},
                                    "schedule": {"name": "constant", "learning_rate": 0.001},
                                    "transformer": {"width": 32, "depth": 1, "heads": 2}})
    shapes = {"inputs": [16], "inputs_segment_ids": [16], "inputs_positions": [16]}
    tf.keras.utils.set_random_seed(0)
    model = build_model(config, strategy=tf.distribute.get_strategy(), kind="cpu", input_shape=shapes,
                        num_classes=259, steps_per_epoch=None, epochs=1, task="language_model", byte_offset=3)
    rng = np.random.default_rng(0)
    segments = np.array([[1] * 5 + [2] * 7 + [0] * 4, [1] * 16], np.int32)
    positions = np.array([list(range(5)) + list(range(7)) + [0] * 4, list(range(16))], np.int32)
    tokens = rng.integers(3, 259, size=[2, 16]).astype(np.int32)
    targets = rng.integers(0, 259, size=[2, 16]).astype(np.int32)
    weights = (segments > 0).astype(np.float32)

    def evaluate(tokens, targets, positions):
        model.reset_metrics()
        return model.test_on_batch({"inputs": tokens, "inputs_segment_ids": segments, "inputs_positions": positions},
                                   targets, sample_weight=weights, return_dict=True)

    clean = evaluate(tokens, targets, positions)
    garbage = segments == 0
    dirty = evaluate(np.where(garbage, 7, tokens), np.where(garbage, 200, targets), np.where(garbage, 3, positions))
    assert set(clean) >= {"loss", "token_accuracy", "cross_entropy", "perplexity", "bits_per_byte"}
    for name, value in clean.items():
        assert dirty[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name


@pytest.mark.slow
def test_the_language_model_learns_the_demo_text(tmp_path):
    """A few hundred steps on the built-in text (pydoc_data.topics) cut validation bits per byte clearly."""
    from tpu_pipeline.records.demo_text import ensure_text_demo
    from tpu_pipeline.train import train

    data_dir = ensure_text_demo(out_dir=str(tmp_path / "demo_text" / "v1"))
    raw = lm_config(data_dir, str(tmp_path / "run"), length=128, epochs=2, steps=100)
    raw["data"]["batch_size"] = raw["eval_data"]["batch_size"] = 16
    raw["model"]["transformer"] = {"width": 64, "depth": 1, "heads": 4, "mlp_dim": 256}
    raw["train"]["eval_steps"] = 4
    raw["cluster"] = {"cpu_replicas": 1}  # learning is the point: the same global batch on 1 replica traces far faster
    metrics = train(config_from_dict(raw), printer=lambda line: None)
    first, last = metrics["history"]["val_bits_per_byte"][0], metrics["history"]["val_bits_per_byte"][-1]
    assert math.log2(259) > first > last and last < 4.5, metrics["history"]


def uninterrupted_documents(raw: dict, steps: int, replicas: int) -> dict[tuple[int, int], list[int]]:
    """(step, replica) -> the documents `train` on one host with `replicas` replicas trains on, never
    interrupted: its one input pipeline's per-replica batches, dealt to the replicas in turn. Computed
    here from the same pipeline (a child run never interrupted logged exactly these, and cost a
    process of its own)."""
    from preemption_child import document_ids
    from tpu_pipeline.pipeline import Pipeline
    from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
    from tpu_pipeline.train.runner import _training_data

    config = config_from_dict(raw)
    pipeline = Pipeline.from_config(_training_data(config), num_classes=config.train.num_classes,
                                    vocab=config_vocabulary(config))
    batches = pipeline.build(tf.distribute.InputContext(1, 0, replicas)).take(steps * replicas)
    return {(index // replicas, index % replicas): document_ids(inputs["inputs"], inputs["inputs_segment_ids"])
            for index, (inputs, _, _) in enumerate(batches)}


@pytest.mark.slow
@pytest.mark.parametrize("keras", ["tf_keras", "keras3"])
def test_train_killed_and_resumed_trains_on_the_same_documents_as_an_uninterrupted_run(tmp_path, keras):
    """keras3: Keras 3 on the TensorFlow backend, whose `fit` took a batch of its own before the real
    iterator's (model/keras_backend.build_for_input): the position log ran ahead and a resume trained on
    other documents from step 6 on."""
    from test_preemption import interrupt, max_step, read_log

    data_dir = converted(tmp_path, count=200, splits="train")
    child = os.path.join(HERE, "preemption_child.py")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([REPO, HERE]),
           **({"KERAS_BACKEND": "tensorflow"} if keras == "keras3" else {})}
    out_dir = str(tmp_path / "killed")
    os.makedirs(out_dir)
    # rows of 128 tokens: every document (under 120 bytes) stays whole, so each segment starts with its number
    raw = lm_config(data_dir, str(tmp_path / "run"), length=128, epochs=3, steps=7, eval_data=False,
                    checkpoint_every_steps=2, max_checkpoints=2)
    raw["cluster"] = {"cpu_replicas": 2}  # a process of its own: fewer replicas trace faster
    # steps run two at a time: positions still per step (Keras 3 on tf.distribute refuses more than 1)
    raw["model"]["steps_per_execution"] = 2 if keras == "tf_keras" else 1
    raw["data"]["sequence"]["row_shuffle"] = 3  # rows shuffled in pools of 3 windows (192 documents)
    raw["model"]["keras"] = keras
    config_path = os.path.join(out_dir, "config.json")
    json.dump(raw, open(config_path, "w"))
    command = [sys.executable, child, "train_lm", config_path, out_dir]
    # 2 SIGKILLs and a SIGTERM (it sent 3 + 1, a child process each: the processes are this test's cost): SIGKILL
    # after steps 3 and 7 (odd: tf_keras runs 2 steps an execution, checkpoints come every 2: resumes from step
    # 2 and, unless step 8 was saved first, from the first epoch's last step, 6), then SIGTERM in the second epoch.
    # Keras 3 gets the kill after step 7 only: what differs there is its own `fit` (its batches, its stop on
    # SIGTERM), which one kill and resume, the SIGTERM and the end show; a resume of a resume is framework-blind.
    for kill, at_step in enumerate((3, 7) if keras == "tf_keras" else (7,)):
        assert max_step(out_dir) < at_step
        result = interrupt(command, out_dir, at_step, signal.SIGKILL, env=env)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
    # SIGTERM, as a preempted TPU VM gets: a checkpoint at the next step, exit 143
    assert max_step(out_dir) < 11
    result = interrupt(command, out_dir, 11, signal.SIGTERM, env=env)
    assert result.returncode == 143 and "stopped by SIGTERM at step" in result.stdout, result.stdout[-3000:]
    final = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "resumed from" in final.stdout and "window" in final.stdout, final.stdout[-3000:]
    killed = read_log(out_dir)  # also checks that a redone step saw the same documents

    expected = uninterrupted_documents(raw, steps=21, replicas=2)
    assert sorted(killed) == sorted(expected) and len({s for s, _ in killed}) == 21
    assert killed == expected
    stream = [doc for key in sorted(killed) for doc in killed[key]]
    assert len(stream) > 200, "21 steps of rows must cover more than one pass"
    # windows of 64 consecutive examples, rows shuffled 3 windows at a time: the first pool's rows hold 192
    # distinct documents of the first pass
    # (the second pool's rows are shuffled too: the first pass's last 8 may come after step 21)
    assert len(set(stream[:192])) == 192 and set(stream) <= set(range(200))

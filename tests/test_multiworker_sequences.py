"""Packed language models on several hosts: two real TF_CONFIG workers on loopback, and the tf.data service.

Workers: each host's packed stream stops at a place of its own; before each save every worker
publishes its position and the chief's checkpoint (the one kept) holds both. One worker is
SIGKILLed (its peer fails on its collective), both start again, one gets SIGTERM, both start again
and finish: at every step each worker trained on the documents of an uninterrupted run, computed
here from the same pipeline (input pipeline i of 2, repeated forever), and a redone step saw the
same documents as the first time.

Service: a packed language model trains through a loopback dispatcher and worker, reports tokens/s
and non-padding, and a resume says where its input restarts (the service cannot resume exactly).

Slow (several TensorFlow processes): `pytest -m "not slow"` skips it locally; CI runs it.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import random
import signal
import subprocess
import sys

import pytest
import tensorflow as tf

from test_multiworker import finish, free_ports, wait_for_step
from test_preemption import CHILD, ENV, REPO, max_step
from test_text_lm import converted, lm_config

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

EPOCHS, STEPS_PER_EPOCH = 3, 6
Log = dict[tuple[int, int], list[int]]


def start_workers(config_path: str, out_dir: str) -> list[subprocess.Popen]:
    """Two `train` processes of a language model in one TF_CONFIG cluster (fresh ports: a new cluster)."""
    addresses = [f"localhost:{port}" for port in free_ports(2)]
    workers = []
    for index in range(2):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        env = {**ENV, "TF_CONFIG": json.dumps(tf_config), "IDS_LOG": f"ids-{index}.log"}
        workers.append(subprocess.Popen([sys.executable, CHILD, "train_lm", config_path, out_dir], cwd=REPO,
                                        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return workers


def every_line(out_dir: str) -> list[tuple[int, int, list[int]]]:
    """(step, replica, documents) of every line every process logged, redone steps included; a last
    line a kill cut short (no newline) is left out."""
    lines = []
    for path in sorted(glob.glob(os.path.join(out_dir, "ids-*.log"))):
        for line in open(path).read().split("\n")[:-1]:
            step, replica, *documents = (int(field) for field in line.split())
            lines.append((step, replica, documents))
    return lines


def uninterrupted(raw: dict, steps: int) -> Log:
    """The documents of each step's batch on each worker, as `train` reads them: input pipeline i of 2,
    one replica each, the data repeated forever."""
    from preemption_child import document_ids
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline
    from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
    from tpu_pipeline.train.runner import _training_data

    config = config_from_dict(raw)
    pipeline = Pipeline.from_config(_training_data(config), num_classes=config.train.num_classes,
                                    vocab=config_vocabulary(config))
    expected: Log = {}
    for worker in range(2):
        stream = pipeline.build(tf.distribute.InputContext(2, worker, 2)).take(steps)
        for step, (inputs, _, _) in enumerate(stream):
            expected[(step, worker)] = document_ids(inputs["inputs"], inputs["inputs_segment_ids"])
    return expected


def show(printed: list[str]) -> str:
    return "\n----\n".join(p[-3000:] for p in printed)


def test_two_workers_train_a_packed_language_model_on_the_documents_of_an_uninterrupted_run(tmp_path):
    data_dir = converted(tmp_path, count=200, splits="train")
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    # rows of 128 tokens: every document (under 120 bytes) stays whole, so each segment starts with its number
    raw = lm_config(data_dir, run_dir, length=128, epochs=EPOCHS, steps=STEPS_PER_EPOCH, eval_data=False,
                    checkpoint_every_steps=2, max_checkpoints=2)
    raw["data"]["sequence"]["window"] = 16  # small windows: the two hosts' places differ soon
    raw["data"]["sequence"]["row_shuffle"] = 2  # and small pools of shuffled rows (the unit of a resume)
    raw["cluster"] = {}  # TF_CONFIG decides: MultiWorkerMirroredStrategy, one replica per worker
    config_path = str(tmp_path / "config.json")
    json.dump(raw, open(config_path, "w"))
    steps = EPOCHS * STEPS_PER_EPOCH
    rng = random.Random(5)

    # 1. Worker 1 dies; worker 0 cannot go on alone and says to start every worker again.
    workers = start_workers(config_path, out_dir)
    wait_for_step(workers, out_dir, rng.randint(4, 7))
    workers[1].send_signal(signal.SIGKILL)
    printed = finish(workers, timeout=120)
    assert workers[0].returncode == 2 and "start every worker again" in printed[0], show(printed)
    killed_at = max_step(out_dir)

    # 2. Both resume, each from its own place in the chief's checkpoint; SIGTERM to worker 1 only:
    # both save the agreed step (each publishing its position) and exit 143.
    workers = start_workers(config_path, out_dir)
    wait_for_step(workers, out_dir, killed_at + rng.randint(2, 3))
    workers[1].send_signal(signal.SIGTERM)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [143, 143], ([w.returncode for w in workers], show(printed))
    assert "input pipeline 0 of 2 from the window at example" in printed[0], show(printed)
    assert "worker 1: resumed from" in printed[1] and "input pipeline 1 of 2 from the window at example" in printed[1], show(printed)

    # 3. Both finish.
    workers = start_workers(config_path, out_dir)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [0, 0], show(printed)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["steps"] == steps and 0 < metrics["resumed_from_step"] < steps, metrics
    assert 0.5 < metrics["non_padding_fraction"] <= 1.0, metrics

    # The kept checkpoint holds both hosts' places, and they differ (each host packs its own documents).
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(run_dir, "checkpoints")))
    example, chunk, in_window = (reader.get_tensor(f"data/{name}/.ATTRIBUTES/VARIABLE_VALUE").tolist()
                                 for name in ("example", "chunk", "in_window"))
    places = list(zip(example, chunk, in_window))
    assert len(places) == 2 and places[0] != places[1], places

    expected = uninterrupted(raw, steps)
    lines = every_line(out_dir)
    assert {(step, replica) for step, replica, _ in lines} == set(expected)
    wrong = [(step, replica) for step, replica, documents in lines if documents != expected[(step, replica)]]
    assert not wrong, f"steps whose documents differ from an uninterrupted run (redone ones included): {wrong[:10]}"
    assert len(lines) > len(expected), "the kill and the SIGTERM must have made the workers redo some steps"
    stream = [doc for key in sorted(expected) for doc in expected[key]]
    assert set(stream) == set(range(200)), "18 steps of 2 hosts must cover every document"


def test_a_packed_language_model_trains_through_the_service_and_a_resume_says_where_its_input_restarts(tmp_path):
    from test_service import Cluster
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.train import train

    data_dir = converted(tmp_path)
    run_dir = str(tmp_path / "run")
    running = Cluster(workers=1)
    try:
        def config(epochs: int, steps: int):
            raw = lm_config(data_dir, run_dir, epochs=epochs, steps=steps)
            raw["data"]["service"] = {"address": running.address}
            raw["cluster"] = {}  # one CPU replica: the default, and the fastest to trace
            return config_from_dict(raw)

        lines: list[str] = []
        metrics = train(config(2, 6), printer=lines.append)
        assert metrics["steps"] == 12, metrics
        assert any(line.startswith(f"input: tf.data service {running.address}") for line in lines), lines
        assert metrics["tokens_per_sec"] > 0 and 0.5 < metrics["non_padding_fraction"] <= 1.0, metrics
        assert metrics["eval_loss"] > 0 and metrics["eval_perplexity"] > 1, metrics

        # Resumed at step 12 with epochs of 5 steps: the rest of epoch 3, then epoch 4, in two `fit` calls.
        lines.clear()
        metrics = train(config(4, 5), printer=lines.append)
        assert metrics["steps"] == 20 and metrics["resumed_from_step"] == 12, metrics
        assert any("data.service cannot resume a data.sequence pack stream exactly" in line
                   and "what the 12 step(s) before trained on comes again" in line for line in lines), lines
        assert metrics["tokens_per_sec"] > 0 and metrics["non_padding_fraction"] > 0.5, metrics
    finally:
        running.stop()


def test_a_packed_language_model_goes_on_exactly_on_one_host_then_on_two_again(tmp_path):
    """Issue 51: two workers get SIGTERM; one host of 2 replicas resumes, the rows the two had left of their epoch
    dealt to it, and is SIGKILLed inside them after a checkpoint; two workers resume from that (what it had not
    read of the rows heads their remainder) and finish. Every document is trained on once an epoch: counted over
    the run, each document m or m + 1 times, all of them at least once."""
    from test_multiworker import two_then_one_then_two

    raw, run_dir, out_dir = slice_change_run(tmp_path)
    epochs, per_epoch = SLICE_CHANGE_EPOCHS

    def killed(resumed_at: int, said: str) -> None:
        assert ("this run has 1 host (2 replicas), the checkpoint 2 hosts: the rows 2 hosts had left of data epoch "
                in said and "are dealt to this host, then each reads its own shard" in said), said[-3000:]
        reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{resumed_at}"))
        dealing = reader.get_tensor("data/rows_remainder/.ATTRIBUTES/VARIABLE_VALUE").decode()
        assert json.loads(dealing)["places"] and len(reader.get_tensor("data/example/.ATTRIBUTES/VARIABLE_VALUE")) == 1

    printed = two_then_one_then_two(raw, tmp_path, start_workers, "train_lm", killed)
    assert ("this run has 2 hosts (2 replicas), the checkpoint 1 host: the rows 1 host had left of data epoch"
            in printed[0] and "an earlier slice" in printed[0]), show(printed)
    assert json.load(open(os.path.join(run_dir, "metrics.json")))["steps"] == epochs * per_epoch
    assert_every_document_once_an_epoch(out_dir, epochs * per_epoch, 200)


SLICE_CHANGE_EPOCHS = (4, 8)  # epochs of 8 steps: ~2.5 passes over the 200 documents


def slice_change_run(tmp_path) -> tuple[dict, str, str]:
    """(the config, run_dir, out_dir) of the runs that change slice: 200 documents in rows of 128, pools of 32
    documents (several a host an epoch), a checkpoint every 2 steps."""
    data_dir = converted(tmp_path, count=200, splits="train")
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    epochs, per_epoch = SLICE_CHANGE_EPOCHS
    raw = lm_config(data_dir, run_dir, length=128, epochs=epochs, steps=per_epoch, eval_data=False,
                    checkpoint_every_steps=2, max_checkpoints=3)
    raw["data"]["sequence"].update(window=16, row_shuffle=2)
    return raw, run_dir, out_dir


def assert_every_document_once_an_epoch(out_dir: str, steps: int, documents: int, first: int = 0) -> None:
    """Over the steps' logged documents (a redone step's last log), each document m or m + 1 times, all of them at
    least once: a document doubled or dropped in an epoch shows as m + 2 or m - 1 beside the others. `first`: the
    documents counted are ids first, first + 1, ... (one source of a mixture)."""
    from test_preemption import read_log

    log = read_log(out_dir)
    assert sorted(log) == [(step, replica) for step in range(steps) for replica in (0, 1)]
    counts = collections.Counter(doc for logged in log.values() for doc in logged if first <= doc < first + documents)
    assert sorted(counts) == list(range(first, first + documents)), f"{documents - len(counts)} never trained on"
    low = min(counts.values())
    assert low >= 1 and max(counts.values()) <= low + 1, collections.Counter(counts.values())

"""A mixture whose weights change on resume, again and again, over documents with no tokens.

Three corpora read once each (`exhausted: drop`, one pass): a document's first token names it (web
1000+, code 2000+, books 3000+); a fifth of the documents hold no token and a fifth one token, which
`lm_shift` makes empty too, so they make no chunk for the packer (a pack window, counted in chunks, then
covers more examples than it has chunks). A run is resumed from its checkpoint with new weights three
times (four segments of weights, the third cut short: changed again one batch later, before its weights
took effect), and must deliver every document of every source exactly once: none twice within its
source's pass, none skipped (drop_remainder: false, so nothing is left in a last short batch). Restored from a
checkpoint at any point of any segment (what a SIGKILL leaves), a run goes on with exactly the same rows.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds

SOURCES = {"web": 90, "code": 60, "books": 40}  # documents per source
FIRST_ID = {"web": 1000, "code": 2000, "books": 3000}
WEIGHTS = [(0.5, 0.3, 0.2), (0.1, 0.1, 0.8), (0.6, 0.3, 0.1), (0.2, 0.5, 0.3)]  # one segment each
# Batches each input pipeline delivers in each segment before the next change (the last one: to the end),
# by mode and number of input pipelines.
PHASES = {("pack", 1): (4, 8, 1, None), ("pack", 2): (2, 4, 1, None), ("pad", 1): (6, 10, 1, None),
          ("pad", 2): (3, 5, 1, None)}
# Batches into a segment where a checkpoint is restored (segment 0 without a change: tests/test_mixture_resume.py).
RESTORE_AT = {1: (1, 3), 3: (2,)}


def document_tokens(name: str, count: int) -> list[list[int]]:
    rng = np.random.default_rng(FIRST_ID[name] + 7)
    out = []
    for d in range(count):
        kind = rng.random()
        if kind < 0.2:
            out.append([])  # no token at all
        elif kind < 0.4:
            out.append([FIRST_ID[name] + d])  # one token: empty after lm_shift
        else:
            out.append([FIRST_ID[name] + d] + rng.integers(1, 900, size=int(rng.integers(1, 48))).tolist())
    return out


def expected_documents() -> dict[str, set[int]]:
    """Each source's documents that reach the model (two tokens or more: one after lm_shift)."""
    return {name: {tokens[0] for tokens in document_tokens(name, count) if len(tokens) >= 2}
            for name, count in SOURCES.items()}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("reweight")
    for name, count in SOURCES.items():
        records = (tf.train.Example(features=tf.train.Features(feature={"tokens": tf.train.Feature(
            int64_list=tf.train.Int64List(value=tokens))})).SerializeToString() for tokens in document_tokens(name, count))
        write_split(records, str(root / name), "train", 3)
    return {name: str(root / name / "train-*.tfrecord") for name in SOURCES}


def config(corpora, mode: str, weight_by: str, weights) -> DataConfig:
    sources = [{"name": name, "weight": weight, "exhausted": "drop", "source": {"files": corpora[name]}}
               for name, weight in zip(SOURCES, weights)]
    sequence = {"keys": ["inputs", "targets"], "length": 32, "mode": mode, "window": 4}
    if mode == "pack":
        sequence.update(row_shuffle=2, overflow="split")
    else:
        sequence["overflow"] = "truncate"
    text = {"mixture": {"sources": sources, "weight_by": weight_by},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "preprocess": [{"op": "lm_shift", "key": "tokens"}], "sequence": sequence, "batch_size": 4,
            "drop_remainder": False,
            "shuffle": {"buffer_size": 32}, "repeat": 1, "seed": 5}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def first_tokens(batch: dict) -> list[int]:
    """The documents that start in a batch (their first input token, where a segment or row starts)."""
    tokens = batch["inputs"].reshape(-1, batch["inputs"].shape[-1])
    if "inputs_positions" in batch:
        positions = batch["inputs_positions"].reshape(tokens.shape)
        segments = batch["inputs_segment_ids"].reshape(tokens.shape)
        return [int(t) for t, p, s in zip(tokens.ravel(), positions.ravel(), segments.ravel())
                if p == 0 and s > 0 and t >= 1000]
    return [int(row[0]) for row in tokens if row[0] >= 1000]


def run(iterator, limit) -> list[dict]:
    out: list[dict] = []
    if limit is not None and limit <= 0:
        return out
    for element in iterator:
        out.append({key: value.numpy() for key, value in element.items()})
        if limit is not None and len(out) == limit:
            break
    return out


def same(got: list[dict], expected: list[dict]) -> bool:
    return len(got) == len(expected) and all(
        set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(got, expected))


def reweighted_run(corpora, tmp_path, mode: str, weight_by: str, context, caplog) -> tuple[list[list[dict]], list[str]]:
    """Each segment's batches (resumed from the last one's checkpoint with its weights), and checked: a
    checkpoint restored at RESTORE_AT batches into a segment delivers that segment's rest exactly."""
    segments: list[list[dict]] = []
    path = None
    messages = []
    for number, (weights, count) in enumerate(zip(WEIGHTS, PHASES[mode, context.num_input_pipelines])):
        make = lambda: Pipeline.from_config(config(corpora, mode, weight_by, weights)).iterator(context)  # noqa: E731
        iterator = make()
        checkpoint = tf.train.Checkpoint(data=iterator)
        caplog.clear()
        with caplog.at_level("WARNING"):
            if path is not None:
                checkpoint.read(path).assert_consumed()
            batches, points = [], {}
            while count is None or len(batches) < count:
                if len(batches) in RESTORE_AT.get(number, ()):
                    points[len(batches)] = checkpoint.write(str(tmp_path / f"segment{number}-at{len(batches)}"))
                got = run(iterator, 1)
                if not got:
                    break
                batches += got
        messages += [record.getMessage() for record in caplog.records if "data.mixture" in record.getMessage()]
        path = checkpoint.write(str(tmp_path / f"segment{number}-end"))
        segments.append(batches)
        for at, saved in points.items():  # as after a SIGKILL there: the same rows on
            restored = make()
            tf.train.Checkpoint(data=restored).read(saved).assert_consumed()
            assert same(run(restored, len(batches) - at), batches[at:]), f"segment {number}: restored at batch {at}"
    return segments, messages


@pytest.mark.slow
@pytest.mark.parametrize("mode, weight_by, pipelines", [("pack", "examples", 1), ("pack", "tokens", 2), ("pad", "tokens", 2)])
def test_weights_changed_three_times_deliver_every_document_once(corpora, tmp_path, mode, weight_by, pipelines, caplog):
    seen: dict[str, list[int]] = collections.defaultdict(list)
    for index in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=index)
        segments, messages = reweighted_run(corpora, tmp_path / f"pipeline{index}", mode, weight_by, context, caplog)
        assert len(messages) == 3, messages  # each change said once, when it was given
        assert all(message.startswith("data.mixture: weights changed since the checkpoint (") for message in messages)
        for batches in segments:
            for first in (first for batch in batches for first in first_tokens(batch)):
                seen[next(name for name in SOURCES if FIRST_ID[name] <= first < FIRST_ID[name] + 1000)].append(first)
        assert all(segments[:2]) and len(segments[2]) == 1 and segments[3]
    expected = expected_documents()
    for name in SOURCES:
        twice = sorted(first for first, count in collections.Counter(seen[name]).items() if count > 1)
        assert not twice, f"{mode}: {name}'s documents {twice} came twice within its one pass"
        missing = sorted(expected[name] - set(seen[name]))
        assert not missing, f"{mode}: {name}'s documents {missing} never came"


def rows(batches: list[dict]) -> list[np.ndarray]:
    return [row for batch in batches for row in batch["inputs"]]


def test_new_weights_take_effect_after_the_rows_in_flight_and_the_line_says_when(corpora, tmp_path, caplog):
    """Pack: the old weights make the pool of windows in flight (its rows delivered as the uninterrupted run
    delivers them), the new ones everything after, and the line gives the rows and batches; pad: at once."""
    for mode in ("pack", "pad"):
        old, new = (config(corpora, mode, "examples", weights) for weights in WEIGHTS[:2])
        iterator = Pipeline.from_config(old).iterator()
        head = run(iterator, 1)
        path = tf.train.Checkpoint(data=iterator).write(str(tmp_path / f"{mode}-old"))
        uninterrupted = rows(run(iterator, 12))
        restored = Pipeline.from_config(new).iterator()
        tf.train.Checkpoint(data=restored).read(path).assert_consumed()
        caplog.clear()
        with caplog.at_level("WARNING"):
            tail = rows(run(restored, 12))
        message = next(record.getMessage() for record in caplog.records if "weights changed" in record.getMessage())
        assert head
        if mode == "pad":
            assert "they take effect at once, from the next batch (example 4 of this input pipeline's stream)" in message
            assert not all(np.array_equal(a, b) for a, b in zip(tail[:8], uninterrupted[:8]))
            continue
        found = re.search(r"they take effect after (\d+) batch\(es\) of this input pipeline: the (\d+) rows? still in "
                          r"flight \(the window at example (\d+), made before the change\)", message)
        assert found, message
        batches, in_flight, window = (int(value) for value in found.groups())
        assert batches == -(-in_flight // 4) and 0 < in_flight < 8, message  # a pool: 2 windows of 4 chunks, a row each at least
        assert all(np.array_equal(a, b) for a, b in zip(tail[:in_flight], uninterrupted[:in_flight]))
        assert not all(np.array_equal(a, b) for a, b in zip(tail[in_flight:in_flight + 8],
                                                              uninterrupted[in_flight:in_flight + 8]))


# --- `train`: weights changed twice on resume, SIGKILLed after a change -----------------------------------------

TRAIN_WEIGHTS = [(0.5, 0.3, 0.2), (0.1, 0.2, 0.7), (0.7, 0.2, 0.1)]


def child_run(command: list[str], out_dir: str, log: str, kill_after_step: Optional[int] = None) -> str:
    """A `train` child logging each step's documents to OUT_DIR/`log`; SIGKILLed once it logged
    `kill_after_step` (None: it runs to the end, exit 0). What it printed."""
    import subprocess
    import time

    from test_preemption import ENV, REPO

    path = os.path.join(out_dir, log)

    def logged() -> int:
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        return max((int(line.split()[0]) for line in lines if len(line.split()) > 2), default=-1)

    child = subprocess.Popen(command, cwd=REPO, env={**ENV, "IDS_LOG": log}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 400
    while kill_after_step is not None and child.poll() is None and logged() < kill_after_step:
        assert time.monotonic() < deadline, "the child made no progress"
        time.sleep(0.05)
    if child.poll() is None and kill_after_step is not None:
        child.send_signal(signal.SIGKILL)
    output, _ = child.communicate(timeout=400)
    expected = -signal.SIGKILL if kill_after_step is not None else 0
    assert child.returncode == expected, output[-4000:]
    return output


def logged_steps(out_dir: str, log: str) -> dict[tuple[int, int], list[int]]:
    """(step, replica) -> documents, the last line of each (a killed child's last line may be cut short)."""
    seen = {}
    for line in open(os.path.join(out_dir, log)).read().splitlines():
        fields = line.split()
        if len(fields) > 2:
            seen[int(fields[0]), int(fields[1])] = [int(field) for field in fields[2:]]
    return seen


@pytest.mark.slow
def test_train_resumed_with_new_weights_twice_and_killed_trains_on_the_iterators_rows(tmp_path):
    """`train` run 1 (weights A, one epoch); run 2 with weights B, SIGKILLed mid-epoch; run 3 with weights C,
    SIGKILLed; run 4 with C to the end. Every step's documents, replica by replica, are those of the
    package's own iterators resumed the same way (which test_weights_changed_three_times... holds to every
    document once), a step redone after the kill with the same weights sees the same documents, and each
    change is printed with the steps after which it takes effect."""
    from preemption_child import document_ids
    from test_mixture_train import CORPORA, HERE, REPLICAS, STEPS, mixture_config

    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
    from tpu_pipeline.train.runner import _training_data

    raw = mixture_config(tmp_path)
    out_dir = str(tmp_path / "out")
    os.makedirs(out_dir)
    command = [sys.executable, os.path.join(HERE, "preemption_child.py"), "train_lm", os.path.join(out_dir, "config.json")]
    command.append(out_dir)

    def configured(weights, epochs: int) -> dict:
        changed = json.loads(json.dumps(raw))
        for source, weight in zip(changed["data"]["mixture"]["sources"], weights):
            source["weight"] = weight
        changed["train"]["epochs"] = epochs
        json.dump(changed, open(os.path.join(out_dir, "config.json"), "w"))
        return changed

    # Killed a step after a checkpoint (every 2 steps), past the rows in flight: each weights' own rows trained on.
    runs = [(TRAIN_WEIGHTS[0], 1, None), (TRAIN_WEIGHTS[1], 3, 2 * STEPS - 1), (TRAIN_WEIGHTS[2], 3, 2 * STEPS + 3),
            (TRAIN_WEIGHTS[2], 3, None)]
    outputs, configs = [], []
    for number, (weights, epochs, kill) in enumerate(runs):
        configs.append(configured(weights, epochs))
        outputs.append(child_run(command, out_dir, f"ids-{number}.log", kill))
    resumed_at = [int(re.search(r"resumed from \S+: step (\d+)", output).group(1)) for output in outputs[1:]]
    assert resumed_at[0] == STEPS and STEPS < resumed_at[1] <= 2 * STEPS - 1 and resumed_at[1] < resumed_at[2]
    changes = [re.findall(r"data\.mixture: weights changed since the checkpoint \(([^)]*)\); they take effect after "
                          r"(\d+) step\(s\) of this input pipeline: the (\d+) rows? still in flight", output)
               for output in outputs]
    assert [len(found) for found in changes] == [0, 1, 1, 0], outputs
    names = list(CORPORA)
    assert changes[1][0][0] == ", ".join(f"{name} {a:g} -> {b:g}" for name, a, b in zip(names, *TRAIN_WEIGHTS[:2]))
    for (_, steps, rows) in (changes[1][0], changes[2][0]):
        assert int(steps) == -(-int(rows) // 8)  # rows per step: the global batch

    # The same resumes through the package's iterators: REPLICAS per-replica batches a step.
    trained = {}
    for number, output in enumerate(outputs):
        trained.update(logged_steps(out_dir, f"ids-{number}.log"))
    ends = [*resumed_at[:2], 3 * STEPS]  # where each weights' part ended: the step the next run resumed at
    expected, path = {}, None
    context = tf.distribute.InputContext(1, 0, REPLICAS)
    for number, (weights, end) in enumerate(zip(TRAIN_WEIGHTS, ends)):
        config = config_from_dict(configs[[0, 1, 2][number]])
        pipeline = Pipeline.from_config(_training_data(config), vocab=config_vocabulary(config))
        iterator = pipeline.iterator(context)
        checkpoint = tf.train.Checkpoint(data=iterator)
        if path is not None:
            checkpoint.read(path).assert_consumed()
        step = int(iterator.position.numpy()) // REPLICAS
        while step < end:
            for replica in range(REPLICAS):
                inputs, _, _ = next(iterator)
                expected[step, replica] = document_ids(inputs["inputs"], inputs["inputs_segment_ids"])
            step += 1
        path = checkpoint.write(str(tmp_path / f"iterator-{number}"))
    assert sorted(trained) == sorted(expected)
    for key in sorted(expected):
        assert trained[key] == expected[key], f"step {key[0]} replica {key[1]}"
    # Redone after the kill with the same weights: the same documents.
    third, fourth = logged_steps(out_dir, "ids-2.log"), logged_steps(out_dir, "ids-3.log")
    redone = sorted(set(third) & set(fourth))
    assert redone and all(third[key] == fourth[key] for key in redone[:-REPLICAS])  # the killed child's last may be cut


def test_mixture_state_keeps_every_segment_of_weights_over_two_resumes(corpora, tmp_path) -> None:
    """`train`'s MixtureState, checkpointed and resumed twice with new weights, saves all three segments
    (each with where it took effect) and a third run continues them all: a checkpoint keeping only the last
    ones would choose the stream's earlier examples with the wrong weights (before, only the slow train test
    above saw it)."""
    from tpu_pipeline.train.mixture_state import MIXTURE_KEY, MixtureState

    pipelines = [Pipeline.from_config(config(corpora, "pad", "examples", weights)) for weights in TRAIN_WEIGHTS]
    rates = [list(pipeline.source.weights) for pipeline in pipelines]
    assert len({tuple(rate) for rate in rates}) == 3  # three different weights: three segments to keep
    resumed_at = (8, 24)  # examples of the stream delivered at each resume (pad: nothing in flight)
    path, lines = None, []
    for number, pipeline in enumerate([*pipelines, pipelines[-1]]):  # the last run resumes without a change
        state = MixtureState(pipeline, 1)
        checkpoint = tf.train.Checkpoint(**{MIXTURE_KEY: state})
        if path is not None:
            checkpoint.read(path).assert_consumed()
            at = resumed_at[min(number, 2) - 1]
            lines += state.resume(lambda context, at=at: (at, 0, 0), num_replicas=1)
        path = checkpoint.write(str(tmp_path / f"run{number}"))
    assert len(lines) == 2 and all(line.startswith("data.mixture: weights changed since the checkpoint (")
                                   for line in lines), lines
    saved = [json.loads(entry) for entry in json.loads(state.segments.numpy().decode())]
    assert [entry["segments"] for entry in saved] == [[[0, rates[0]], [8, rates[1]], [24, rates[2]]]]
    continued = state.pipeline(0).source  # the run after: every segment still in force where it was
    assert continued.earlier == ((0, tuple(rates[0])), (8, tuple(rates[1]))) and continued.since == 24

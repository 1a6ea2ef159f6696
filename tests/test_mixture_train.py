"""A mixture through `train`: SIGKILLed mid-run (three times), resumed, and the documents it trained on,
by id and in order, step by step and replica by replica, are those of a run never interrupted.

Three text corpora (converted with `convert --from text`, byte tokens) are mixed: two repeat, one small
one drops out part way. Each document's text starts with its number in 5 digits, the number range
naming the corpus, so a packed row's segments say which documents (and corpora) a step trained on
(`preemption_child.document_ids`). The uninterrupted run is computed here from the same pipeline, as
tests/test_text_lm.py's kill-and-resume does (a child run never interrupted logged exactly these).
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys

import pytest

from tpu_pipeline.records.convert import ConvertOptions, convert
from tpu_pipeline.records.text_input import TextSource

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORDS = "the of a TPU packs rows tokens and into attention segment model data mixture weight".split()
# name: (first document number, documents, weight, exhausted)
CORPORA = {"prose": (0, 120, 0.5, "repeat"), "code": (20000, 80, 0.3, "repeat"), "notes": (40000, 24, 0.2, "drop")}
STEPS, EPOCHS, REPLICAS = 7, 3, 2


def write_corpus(directory: str, first: int, count: int, seed: int) -> str:
    """`count` documents as JSON lines, numbered from `first` (5 digits, then 2..9 words: under 100 bytes,
    so each stays whole in a row of 128 and its segment starts with its number)."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "corpus.jsonl")
    with open(path, "w") as handle:
        for index in range(count):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9)))
            handle.write(json.dumps({"text": f"{first + index:05d} {words}."}) + "\n")
    return path


def corpus_of(document: int) -> str:
    return next(name for name, (first, count, _, _) in CORPORA.items() if first <= document < first + count)


def mixture_config(tmp_path) -> dict:
    from test_text_lm import lm_config

    sources = []
    for seed, (name, (first, count, weight, exhausted)) in enumerate(CORPORA.items()):
        out = str(tmp_path / "corpora" / name)
        convert(TextSource([write_corpus(str(tmp_path / "text" / name), first, count, seed)], splits="train",
                           text_field="text"), out, ConvertOptions(min_shards=2, progress=False))
        sources.append({"name": name, "weight": weight, "exhausted": exhausted,
                        "source": {"type": "tfrecord", "dir": out, "split": "train"}})
    raw = lm_config(sources[0]["source"]["dir"], str(tmp_path / "run"), length=128, epochs=EPOCHS, steps=STEPS,
                    eval_data=False, checkpoint_every_steps=2, max_checkpoints=2)
    del raw["data"]["source"]
    raw["data"]["mixture"] = {"sources": sources}
    raw["data"]["sequence"]["row_shuffle"] = 2  # rows shuffled in pools of 2 windows
    raw["cluster"] = {"cpu_replicas": REPLICAS}  # a process of its own: fewer replicas trace faster
    raw["model"]["steps_per_execution"] = 2  # steps run two at a time: positions still per step
    return raw


def test_train_of_a_mixture_killed_and_resumed_trains_on_the_documents_of_an_uninterrupted_run(tmp_path):
    from test_preemption import ENV, interrupt, max_step, read_log
    from test_text_lm import uninterrupted_documents

    raw = mixture_config(tmp_path)
    out_dir = str(tmp_path / "killed")
    os.makedirs(out_dir)
    config_path = os.path.join(out_dir, "config.json")
    json.dump(raw, open(config_path, "w"))
    command = [sys.executable, os.path.join(HERE, "preemption_child.py"), "train_lm", config_path, out_dir]
    rng = random.Random(5)
    for kill in range(3):
        result = interrupt(command, out_dir, max_step(out_dir) + rng.randint(2, 4), signal.SIGKILL)
        assert result.returncode == -signal.SIGKILL, f"kill {kill}:\n{result.stdout[-3000:]}"
    final = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert "resumed from" in final.stdout, final.stdout[-3000:]
    killed = read_log(out_dir)  # also checks that a redone step saw the same documents

    steps = STEPS * EPOCHS
    expected = uninterrupted_documents(raw, steps=steps, replicas=REPLICAS)
    assert sorted(killed) == sorted(expected) and len({step for step, _ in killed}) == steps
    assert killed == expected
    stream = [document for key in sorted(killed) for document in killed[key]]
    assert len(stream) > 150, "the run must train on a few hundred documents"
    corpora = collections.Counter(corpus_of(document) for document in stream)
    assert set(corpora) == set(CORPORA), corpora  # every corpus trained on
    assert corpora["prose"] > corpora["code"] > corpora["notes"]
    # The small corpus drops out part way: each of its documents exactly once, none after its end.
    notes = [document for document in stream if corpus_of(document) == "notes"]
    assert sorted(notes) == list(range(40000, 40024))

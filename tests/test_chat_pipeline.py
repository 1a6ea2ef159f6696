"""Chat data through the pipeline (issue 50, items 3 and 6): converted conversations packed into rows, alone and
mixed with plain text, and resumed after SIGKILLs.

The data is real: the chat demo's first question/answer pairs about the Python standard library (records/demo_chat.py),
converted by `convert --from chat` (ChatML, byte-level); the plain text is `convert --from text` output. What the
weighted targets of each packed segment decode to is checked against the conversations' own answers, not against
what the converter wrote.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS
from tpu_pipeline.format import dataset_tokenizer
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records import ConvertOptions, convert
from tpu_pipeline.records.chat_input import ChatSource
from tpu_pipeline.records.demo_chat import write_instruction_set
from tpu_pipeline.records.text_input import TextSource

from batch_hash_child import batch_hash
from test_text_lm import write_corpus

pytestmark = pytest.mark.tf_builds

LENGTH = 256
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "batch_hash_child.py")
TOKENS = {"dtype": "int64", "kind": "ragged"}


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("chat_pipeline")
    path = write_instruction_set(str(root / "qa"), schemas=("messages",), limit=160)["messages"][0]
    chat = str(root / "chat")
    # LENGTH + 1 tokens at most: lm_shift's LENGTH targets fill one row, no conversation is cut across rows
    convert(ChatSource([path], max_tokens=LENGTH + 1, seed=1), chat, ConvertOptions(min_shards=2, progress=False))
    plain = str(root / "chat_all")  # the same conversations, every token trained (plain `tokens`, no weights)
    convert(ChatSource([path], max_tokens=LENGTH + 1, seed=1, loss_on="all"), plain,
            ConvertOptions(min_shards=2, progress=False))
    text = str(root / "text")
    convert(TextSource([write_corpus(root / "corpus", 200, seed=4)], text_field="text"), text,
            ConvertOptions(min_shards=2, progress=False))
    conversations = [json.loads(line)["messages"] for line in open(path, encoding="utf-8")]
    return {"chat": chat, "chat_all": plain, "text": text, "conversations": conversations}


def answer_suffixes(conversations: list[list[dict]]) -> set[str]:
    """What a conversation's weighted targets may decode to: its answers, each with <|im_end|>, from some turn on
    (a conversation over the limit keeps only its last exchanges)."""
    found = set()
    for messages in conversations:
        answers = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
        found.update("".join(answers[k:]) for k in range(len(answers)))
    return found


def chat_data(directory: str, **overrides) -> dict:
    data = {"source": {"type": "tfrecord", "dir": directory, "split": "train"},
            "features": {WEIGHTED_TOKENS: TOKENS},  # each token 2 * id + weight, as convert --from chat writes
            "preprocess": [{"op": "lm_shift", "key": WEIGHTED_TOKENS}],
            "sequence": {"keys": ["inputs", "targets", LOSS_WEIGHTS], "length": LENGTH, "mode": "pack", "window": 16},
            "shuffle": {"buffer_size": 64}, "repeat": 1, "batch_size": 4, "drop_remainder": False, "seed": 5}
    data.update(overrides)
    return data


def mixture_data(sets: dict, weighted: bool, **overrides) -> dict:
    """SFT plus some pretraining text, 70/30 by tokens, until a source runs out; `weighted=False`: the same without
    the chat set's weights."""
    data = chat_data(sets["chat"], **overrides)
    data.pop("source")
    data["preprocess"] = []
    chat_key = WEIGHTED_TOKENS if weighted else "tokens"
    default = {"default_weight": 1} if weighted else {}
    if not weighted:
        data["features"] = {"tokens": TOKENS}
        data["sequence"] = {**data["sequence"], "keys": ["inputs", "targets"]}
    data["mixture"] = {"weight_by": "tokens", "sources": [
        {"name": "chat", "weight": 0.7, "exhausted": "stop",
         "source": {"type": "tfrecord", "dir": sets["chat" if weighted else "chat_all"], "split": "train"},
         "features": {chat_key: TOKENS}, "preprocess": [{"op": "lm_shift", "key": chat_key}]},
        {"name": "text", "weight": 0.3, "exhausted": "stop", "source": {"type": "tfrecord", "dir": sets["text"], "split": "train"},
         "features": {"tokens": TOKENS}, "preprocess": [{"op": "lm_shift", "key": "tokens", **default}]}]}
    return data


def lm_pipeline(data: dict) -> Pipeline:
    config = config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})
    return Pipeline.from_config(config.data)


def segments(inputs: dict, targets: np.ndarray, weights: np.ndarray):
    """(targets, weights) of each packed segment of a batch, row by row."""
    ids = inputs["inputs_segment_ids"]
    for row in range(ids.shape[0]):
        for segment in range(1, int(ids[row].max(initial=0)) + 1):
            where = ids[row] == segment
            yield targets[row][where], weights[row][where]


def test_each_packed_conversation_trains_on_its_answers_and_their_end_of_turn_only(sets):
    tokenizer = dataset_tokenizer(sets["chat"])
    expected = answer_suffixes(sets["conversations"])
    count = 0
    for inputs, targets, weights in lm_pipeline(chat_data(sets["chat"])).build():
        inputs = {key: value.numpy() for key, value in inputs.items()}
        for seg_targets, seg_weights in segments(inputs, targets.numpy(), weights.numpy()):
            assert set(np.unique(seg_weights)) <= {0, 1}
            decoded = tokenizer.decode(seg_targets[seg_weights == 1].tolist())
            assert decoded in expected, decoded[:200]
            count += 1
    assert count > 100


def test_chat_mixed_with_text_delivers_the_rows_of_the_same_mixture_without_weights(sets):
    """The weights ride along and change nothing else: the same rows, in the same order (so the sources' token
    shares are what they are without weights), with weight 1 on every real target of a text document and the
    answers' weights on the chat documents'."""
    weighted = list(lm_pipeline(mixture_data(sets, True)).build())
    plain = list(lm_pipeline(mixture_data(sets, False)).build())
    assert len(weighted) == len(plain) > 20
    chat_tokens = text_tokens = 0
    for (inputs, targets, weights), (plain_inputs, plain_targets, plain_weights) in zip(weighted, plain):
        for key in plain_inputs:
            np.testing.assert_array_equal(inputs[key].numpy(), plain_inputs[key].numpy())
        np.testing.assert_array_equal(targets.numpy(), plain_targets.numpy())
        real = plain_weights.numpy() > 0
        weights = weights.numpy()
        assert (weights[~real] == 0).all()
        for seg_targets, seg_weights in segments({k: v.numpy() for k, v in inputs.items()}, targets.numpy(), weights):
            if (seg_targets >= 259).any():  # a chat segment holds the template's <|im_start|>/<|im_end|>
                chat_tokens += len(seg_targets)
                assert 0 < seg_weights.sum() < len(seg_weights)
            else:
                text_tokens += len(seg_targets)
                assert (seg_weights == 1).all()
    share = chat_tokens / (chat_tokens + text_tokens)
    assert 0.6 < share < 0.8, share  # 70/30 by tokens; the exact shares are those of the unweighted mixture above


def test_an_epoch_of_given_steps_that_is_many_passes_over_the_data_is_told_with_the_steps_of_one(sets):
    """configs/chat_sft.yaml's 50 steps of 16 rows, reused on a small set, are many passes over it: train says so,
    counted from metadata.json, with the train.steps_per_epoch of one pass; one pass or under says nothing."""
    from tpu_pipeline.format import read_metadata
    from tpu_pipeline.train.data_passes import passes_note

    def note(data: dict, steps: "int | None") -> "str | None":
        config = config_from_dict({"data": data, "train": {"task": "language_model", "steps_per_epoch": steps},
                                   "model": {"architecture": "transformer"}})
        return passes_note(config, Pipeline.from_config(config.data), steps or 1)

    tokens = read_metadata(sets["chat"])["splits"]["train"]["num_tokens"]
    rows = tokens / LENGTH  # rows of LENGTH a pass, about
    many = note(chat_data(sets["chat"], batch_size=16), 50)
    assert many == (f"note: an epoch here is train.steps_per_epoch=50 steps of 16 packed rows of {LENGTH}, about "
                    f"{50 * 16 / rows:,.0f} passes over the training data (about {rows:,.0f} packed rows a pass); for "
                    f"one pass an epoch set train.steps_per_epoch={round(rows / 16)}"), many
    one_pass = max(1, int(rows // 4))  # batch 4: at most one pass
    assert note(chat_data(sets["chat"]), one_pass) is None
    assert note(chat_data(sets["chat"], batch_size=16), None) is None  # an epoch is then one pass
    # Examples (pad mode): counted from the split's examples.
    examples = read_metadata(sets["chat"])["splits"]["train"]["num_examples"]
    padded = chat_data(sets["chat"], sequence={"keys": ["inputs", "targets", LOSS_WEIGHTS], "length": LENGTH,
                                               "mode": "pad"})
    assert f"about {100 * 4 / examples:,.0f} passes" in note(padded, 100) and "of 4 examples" in note(padded, 100)


def read_log(path: str) -> list[tuple[int, str]]:
    if not os.path.exists(path):
        return []
    return [(int(line.split()[0]), line.split()[1]) for line in open(path).read().split("\n")[:-1]]


@pytest.mark.slow
def test_a_chat_and_text_mixture_killed_twice_resumes_with_the_same_batches(sets, tmp_path):
    data = mixture_data(sets, True, sequence={"keys": ["inputs", "targets", LOSS_WEIGHTS],
                                                        "length": LENGTH, "mode": "pack", "window": 16,
                                                        "row_shuffle": 2})
    config = {"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}}
    uninterrupted = [batch_hash(batch) for batch in lm_pipeline(data).build()]
    assert len(uninterrupted) > 20
    config_path, out_dir = str(tmp_path / "config.json"), str(tmp_path / "out")
    os.makedirs(out_dir)
    json.dump(config, open(config_path, "w"))
    log = os.path.join(out_dir, "ids.log")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([REPO, HERE])}
    command = [sys.executable, CHILD, config_path, out_dir]
    rng = random.Random(50)
    for kill in range(2):
        target = max((s for s, _ in read_log(log)), default=-1) + rng.randint(3, 8)
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 240
        while child.poll() is None and max((s for s, _ in read_log(log)), default=-1) < target:
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.03))
        child.send_signal(signal.SIGKILL)
        output, _ = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, f"kill {kill}: the child ended by itself:\n{output[-3000:]}"
        assert kill == 0 or "restored at step" in output
    final = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0 and "done" in final.stdout, final.stdout[-2000:] + final.stderr[-3000:]
    lines = read_log(log)
    assert [step for step, _ in lines] == list(range(len(uninterrupted))), "a step missing or logged twice"
    assert [digest for _, digest in lines] == uninterrupted, "the killed run delivered other batches"


@pytest.mark.parametrize("mode", ["pack", "bucket"])
def test_demo_show_prints_packed_rows_with_exactly_the_answers_marked(sets, tmp_path, capsys, mode):
    """Each row's conversations whole, their answers marked; a bucketed row (no segment ids) too: it showed only the
    weighted answer, its prompt gone, when the row's tokens were read from the weights."""
    import re

    import yaml
    from absl import flags

    from tpu_pipeline.cli import main

    data = chat_data(sets["chat"])
    data["sequence"] = {**data["sequence"], "mode": mode}
    if mode == "bucket":
        data["sequence"].pop("window")
        data.pop("drop_remainder")
    config = {"data": {**data, "shuffle": {"enabled": False}},
              "train": {"task": "language_model"}, "model": {"architecture": "transformer"}}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        main(["tpu-pipeline", "demo", "--config", str(path), "--show", "3"])
    except SystemExit as exit_:
        assert not exit_.code
    finally:
        flags.FLAGS.unparse_flags()
    out = capsys.readouterr().out
    assert len(re.findall(r"^row \d+: ", out, flags=re.M)) == 3
    segments = out.split("--- segment ")[1:]
    assert segments and all("<|im_start|>user" in segment for segment in segments), out  # each prompt is there
    marked = [text for segment in out.split("--- segment ")[1:] for text in re.findall("⟦(.*?)⟧", segment, flags=re.S)]
    expected = answer_suffixes(sets["conversations"])
    assert marked and all(text.endswith("<|im_end|>") for text in marked)
    # each conversation's marked answers, joined, are its answers: nothing of a prompt, no newline before them
    for segment in out.split("--- segment ")[1:]:
        assert "".join(re.findall("⟦(.*?)⟧", segment, flags=re.S)) in expected

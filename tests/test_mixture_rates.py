"""Rates you can see: each mixed example carries its source (in pack mode each row its counts of each
source's tokens and segments), and what `train`
reports per source is checked against counts made independently from the tokens themselves.

Three corpora whose token ids name their source (web 1000-1999, code 2000-2999, books 3000-3999), so
a token's source can be read off the token, whatever the pipeline did to it.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.model import tf_keras
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.mixtures.share_meter import source_counts
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds

NAMES = ("web", "code", "books")
DOCUMENTS = {"web": 120, "code": 80, "books": 60}
WEIGHTS = (0.5, 0.3, 0.2)
VOCAB = 4000
LENGTHS = ((2, 20), (10, 60), (30, 100))  # tokens per document: each source its own mean


def documents(index: int, count: int, seed: int):
    rng = np.random.default_rng(seed * 10 + index)
    for _ in range(count):
        shortest, longest = LENGTHS[index]
        tokens = (1000 * (index + 1) + rng.integers(0, 1000, size=int(rng.integers(shortest, longest)))).tolist()
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("rates")
    for index, name in enumerate(NAMES):
        write_split(documents(index, DOCUMENTS[name], 1), str(root / name), "train", 2)
        write_split(documents(index, DOCUMENTS[name] // 4, 2), str(root / name), "validation", 1)
    return {name: str(root / name) for name in NAMES}


def data_section(corpora, mode: str, split: str = "train", exhausted: str = "repeat", lm: bool = False) -> dict:
    sources = [{"name": name, "weight": weight, "exhausted": exhausted,
                "source": {"type": "tfrecord", "files": f"{corpora[name]}/{split}-*"}}
               for name, weight in zip(NAMES, WEIGHTS)]
    keys = ["inputs", "targets"] if lm else ["tokens"]
    sequence = {"keys": keys, "length": 32, "mode": mode, "window": 16, "overflow": "split" if mode == "pack" else "truncate"}
    if mode == "bucket":
        sequence["boundaries"] = [16, 32]
    section = {"mixture": {"sources": sources}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
               "sequence": sequence, "batch_size": 8, "seed": 3,
               "repeat": "forever" if exhausted == "repeat" else 1}
    if lm:
        marker = "targets_segment_ids" if mode == "pack" else "targets_mask"
        section["preprocess"] = [{"op": "lm_shift", "key": "tokens"}]
        section["outputs"] = {"inputs": "inputs", "targets": "targets", "weights": marker}
    return section


def batches(section: dict, count: int) -> list[dict]:
    config = DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(section)), context={"prefix": "data"})
    out = []
    for batch in Pipeline.from_config(config).build().take(count):
        out.append({key: value.numpy() for key, value in batch.items()})
    return out


def independent_counts(batch: dict, key: str = "tokens") -> tuple[np.ndarray, np.ndarray]:
    """(examples, real tokens) per source, read off the token ids: pack → segments; else rows."""
    tokens = batch[key]
    if f"{key}_segment_ids" in batch:
        real = batch[f"{key}_segment_ids"] > 0
        starts = real & (batch[f"{key}_positions"] == 0)
    else:
        real = batch[f"{key}_mask"] == 1
        starts = np.zeros_like(real)
        starts[:, 0] = real[:, 0] if "example_mask" not in batch else (real[:, 0] & (batch["example_mask"] > 0))
    source = tokens // 1000 - 1
    return (np.bincount(source[starts], minlength=3).astype(np.int64),
            np.bincount(source[real], minlength=3).astype(np.int64))


@pytest.fixture(scope="module")
def first_batches(corpora):
    """mode → the first 20 batches of that mode's mixture, read once for the two tests below that only look
    at them (the same config and seed: the same stream either test would read itself)."""
    read: dict[str, list[dict]] = {}

    def first(mode: str, count: int) -> list[dict]:
        if mode not in read:
            read[mode] = batches(data_section(corpora, mode), 20)
        assert count <= len(read[mode])
        return read[mode][:count]

    return first


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_every_token_and_example_carries_its_source(first_batches, mode):
    seen = np.zeros(3, np.int64)
    for batch in first_batches(mode, 20):
        tokens = batch["tokens"]
        if mode == "pack":  # each row counts its tokens and segments of each source
            segments, owner = batch["tokens_segment_ids"], tokens // 1000 - 1
            assert "_source" not in batch and batch["_source_tokens"].shape == (len(tokens), 3)
            for row in range(len(tokens)):
                real = segments[row] > 0
                assert np.array_equal(batch["_source_tokens"][row], np.bincount(owner[row][real], minlength=3))
                firsts = [owner[row][segments[row] == s][0] for s in range(1, segments[row].max() + 1)]
                assert np.array_equal(batch["_source_segments"][row], np.bincount(firsts, minlength=3).astype(int))
            seen += batch["_source_segments"].sum(axis=0)
            continue
        else:
            source = batch["_source"]
            real = batch["tokens_mask"] == 1
            rows = real[:, 0] if "example_mask" not in batch else real[:, 0] & (batch["example_mask"] > 0)
            assert source.shape == tokens.shape[:1]
            for row in np.flatnonzero(rows):
                assert set(tokens[row][real[row]] // 1000 - 1) == {source[row]}
        seen += np.bincount(source[source >= 0].ravel(), minlength=3)
    assert np.all(seen > 0), seen  # every source came


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_source_counts_equal_counts_read_off_the_tokens(first_batches, mode):
    for batch in first_batches(mode, 12):
        examples, tokens = source_counts(batch, 3)
        expected_examples, expected_tokens = independent_counts(batch)
        assert np.array_equal(examples.numpy(), expected_examples)
        assert np.array_equal(tokens.numpy(), expected_tokens)


def test_reported_shares_are_each_of_its_own_count(corpora, first_batches) -> None:
    """`mixture_counts` (metrics.json, bench, doctor) gives token_share of the tokens and example_share of the
    examples, and `shares_line` shows token shares under weight_by: tokens, on the counts the meter adds up:
    the sources' documents differ in length, so shares of the wrong count show (before, only train's and
    bench's runs saw it)."""
    from tpu_pipeline.pipeline.mixtures.share_meter import mixture_counts, shares_line

    examples, tokens = np.zeros(3, np.int64), np.zeros(3, np.int64)
    for batch in first_batches("pack", 12):  # what SourceMeter adds up, batch by batch
        counted = source_counts(batch, 3)
        examples, tokens = examples + counted[0].numpy(), tokens + counted[1].numpy()
    example_shares, token_shares = examples / examples.sum(), tokens / tokens.sum()
    assert np.abs(example_shares - token_shares).max() > 0.05  # a swap of the two counts shows
    mixture = DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(data_section(corpora, "pack"))),
                                        context={"prefix": "data"}).mixture
    reported = mixture_counts(mixture, examples.tolist(), tokens.tolist())
    for index, name in enumerate(NAMES):
        assert reported[name]["examples"] == examples[index] and reported[name]["tokens"] == tokens[index]
        assert reported[name]["example_share"] == pytest.approx(example_shares[index])
        assert reported[name]["token_share"] == pytest.approx(token_shares[index])
    line = shares_line(mixture.model_copy(update={"weight_by": "tokens"}), examples.tolist(), tokens.tolist())
    assert line == "tokens by source: " + ", ".join(
        f"{name} {share:.3f} ({weight:.3g})" for name, share, weight in zip(NAMES, token_shares, WEIGHTS))


def per_token_model(input_shape, num_classes):
    tokens = tf_keras.Input([None], dtype=tf.int32)
    return tf_keras.Model(tokens, tf_keras.layers.Dense(VOCAB)(tf_keras.layers.Embedding(VOCAB, 8)(tokens)))


def test_train_reports_what_each_source_delivered_and_eval_loss_by_source(corpora, tmp_path):
    """metrics.json's per-source counts are exactly those of a prefix of the same stream read independently
    (the meter also counts the few batches prefetched at the end), and the mixture's eval_loss is the
    token-weighted mean of the per-source eval losses (a position-wise model: a token's loss has no context)."""
    from tpu_pipeline.train import train

    steps = 12
    config = config_from_dict({
        "data": data_section(corpora, "pack", lm=True),
        "eval_data": data_section(corpora, "pack", split="validation", exhausted="drop", lm=True),
        "train": {"task": "language_model", "epochs": 1, "steps_per_epoch": steps, "run_dir": str(tmp_path / "run"),
                  "tensorboard": False, "num_classes": VOCAB, "log_every_steps": 100},
    })
    lines: list[str] = []
    metrics = train(config, model_fn=per_token_model, printer=lines.append)

    reported = metrics["mixture"]["sources"]
    got_examples = np.array([reported[name]["examples"] for name in NAMES])
    got_tokens = np.array([reported[name]["tokens"] for name in NAMES])
    running_examples, running_tokens, prefixes = np.zeros(3, np.int64), np.zeros(3, np.int64), []
    features_only = {key: value for key, value in data_section(corpora, "pack", lm=True).items() if key != "outputs"}
    for batch in batches(features_only, steps + 64):
        examples, tokens = independent_counts(batch, "targets")
        running_examples, running_tokens = running_examples + examples, running_tokens + tokens
        prefixes.append((running_examples.copy(), running_tokens.copy()))
    matching = [k + 1 for k, (e, t) in enumerate(prefixes) if np.array_equal(e, got_examples) and np.array_equal(t, got_tokens)]
    assert matching and matching[0] >= steps, (got_examples, got_tokens, prefixes[steps - 1])
    assert [reported[name]["weight"] for name in NAMES] == pytest.approx(WEIGHTS)
    # Each share against the counts read off the delivered batches (the prefix the counts matched), value by value.
    counted_examples, counted_tokens = prefixes[matching[0] - 1]
    for index, name in enumerate(NAMES):
        assert reported[name]["example_share"] == pytest.approx(counted_examples[index] / counted_examples.sum())
        assert reported[name]["token_share"] == pytest.approx(counted_tokens[index] / counted_tokens.sum())
    # The sources' documents differ in mean length: the two shares differ, so a swap shows.
    assert np.abs(counted_examples / counted_examples.sum() - counted_tokens / counted_tokens.sum()).max() > 0.05
    assert any(line.startswith("epoch 1/1:") and "examples by source: web " in line for line in lines), lines
    assert any(line.startswith("trained on examples by source") for line in lines), lines

    by_source = metrics["eval_by_source"]
    assert set(by_source) == set(NAMES)
    eval_tokens = np.zeros(3, np.int64)  # each validation document once (drop), n tokens → n - 1 targets
    for index, name in enumerate(NAMES):
        eval_tokens[index] = sum(len(tf.train.Example.FromString(record).features.feature["tokens"].int64_list.value) - 1
                                 for record in documents(index, DOCUMENTS[name] // 4, 2))
    mixed = sum(by_source[name]["eval_loss"] * eval_tokens[i] for i, name in enumerate(NAMES)) / eval_tokens.sum()
    assert metrics["eval_loss"] == pytest.approx(mixed, rel=1e-4)
    assert len({round(by_source[name]["eval_loss"], 4) for name in NAMES}) == 3  # three different sources
    assert any(line.startswith("evaluation by source: web eval_loss") for line in lines), lines


def test_doctor_shows_the_delivered_shares_beside_the_weights(corpora):
    from tpu_pipeline.bench.doctor import diagnose

    config = DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(data_section(corpora, "pad"))), context={"prefix": "data"})
    diagnosis = diagnose(config, batches=4, repeats=1, measure_tuned=False)
    counts = diagnosis.sources["counts"]
    assert [counts[name]["weight"] for name in NAMES] == pytest.approx(WEIGHTS)
    assert sum(counts[name]["examples"] for name in NAMES) >= 4 * 8  # at least the timed batches' rows
    # pad mode, every source repeating: the first n examples hold exactly the schedule's counts at n
    delivered = sum(counts[name]["examples"] for name in NAMES)
    schedule = Pipeline.from_config(config).source.positions(tf.distribute.InputContext())
    assert [counts[name]["examples"] for name in NAMES] == schedule.taken(delivered).tolist()
    assert "  examples by source: web " in diagnosis.table() and "(0.5)" in diagnosis.table()
    assert diagnosis.as_dict()["sources"] == counts


def test_demo_and_bench_print_the_shares_of_a_mixture(corpora, tmp_path):
    import json
    import os
    import sys

    from helpers import run_together

    path = tmp_path / "mixture.yaml"
    path.write_text(yaml.safe_dump({"data": data_section(corpora, "pack")}))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commands = (["demo", "--steps", "5", "--warmup", "1"],
                ["bench", "--steps", "5", "--repeats", "1", "--warmup", "1", "--noceilings", "--json", str(tmp_path / "b.json")])
    # demo and bench share nothing but the config they read: run side by side, each checked as before.
    results = run_together([[sys.executable, "-m", "tpu_pipeline.cli", *command, "--config", str(path)]
                            for command in commands], timeout=300, cwd=repo)
    for command, result in zip(commands, results):
        assert result.returncode == 0, f"{command[0]}: {result.stderr[-3000:]}"
        line = next(line for line in result.stdout.splitlines() if "examples by source: " in line)
        assert "web " in line and "(0.5)" in line and "books " in line and "(0.2)" in line, line
    sources = json.loads((tmp_path / "b.json").read_text())["sources"]
    assert set(sources) == set(NAMES)
    examples = {name: part["examples"] for name, part in sources.items()}
    tokens = {name: part["tokens"] for name, part in sources.items()}
    for name, part in sources.items():  # each share is of its own count
        assert part["example_share"] == pytest.approx(examples[name] / sum(examples.values()))
        assert part["token_share"] == pytest.approx(tokens[name] / sum(tokens.values()))


def test_weight_by_tokens_holds_the_delivered_token_shares_to_the_weights(corpora):
    """After packing, over several epochs of every source: the token shares read off the tokens are the
    weights; with weight_by: examples they are not (the sources' documents differ in mean length)."""
    for weight_by in ("tokens", "examples"):
        section = data_section(corpora, "pack")
        section["mixture"]["weight_by"] = weight_by
        tokens = np.zeros(3, np.int64)
        for batch in batches(section, 400):
            tokens += independent_counts(batch)[1]
        assert tokens.sum() > 90_000
        shares = tokens / tokens.sum()
        if weight_by == "tokens":
            assert shares == pytest.approx(WEIGHTS, abs=0.01)
        else:
            assert np.abs(shares - WEIGHTS).max() > 0.1, shares

"""A mixture through the whole pipeline: every sequence mode, restored from a checkpoint of the iterators.

Three token corpora (documents of 1..48 tokens whose first token names the document) are mixed; the
iterator is checkpointed along one uninterrupted pass and restored at each point: the restored stream
must equal the rest of the uninterrupted one batch for batch, and no document may come twice within
its source's epoch.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds

SOURCES = {"web": 90, "code": 60, "books": 40}  # documents per source
FIRST_ID = {"web": 1000, "code": 2000, "books": 3000}  # document d of a source starts with token FIRST_ID + d


def documents(name: str, count: int):
    rng = np.random.default_rng(FIRST_ID[name])
    for d in range(count):
        tokens = [FIRST_ID[name] + d] + rng.integers(1, 900, size=int(rng.integers(0, 48))).tolist()
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpora")
    for name, count in SOURCES.items():
        write_split(documents(name, count), str(root / name), "train", 3)
    return {name: str(root / name / "train-*.tfrecord") for name in SOURCES}


def mixture_config(corpora, mode: str, exhausted: str = "drop", parse: str = "auto", batch_size: int = 8) -> DataConfig:
    sources = [{"name": name, "weight": weight, "exhausted": exhausted, "source": {"files": corpora[name]}}
               for name, weight in zip(SOURCES, (0.5, 0.3, 0.2))]
    sequence = {"keys": ["tokens"], "length": 32, "mode": mode, "window": 16}
    if mode == "pack":
        sequence["row_shuffle"] = 2
    text = {"mixture": {"sources": sources}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": sequence, "batch_size": batch_size, "parse": parse, "shuffle": {"buffer_size": 32},
            "repeat": 1 if exhausted != "repeat" else "forever", "seed": 5}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def first_tokens(batch: dict) -> list[int]:
    """The documents that start in a batch (their first token, where a segment or row starts)."""
    tokens = np.asarray(batch["tokens"]).reshape(-1, np.asarray(batch["tokens"]).shape[-1])
    if "tokens_positions" in batch:
        positions = np.asarray(batch["tokens_positions"]).reshape(tokens.shape)
        segments = np.asarray(batch["tokens_segment_ids"]).reshape(tokens.shape)
        return [int(t) for t, p, s in zip(tokens.ravel(), positions.ravel(), segments.ravel()) if p == 0 and s > 0
                and t >= 1000]
    return [int(row[0]) for row in tokens if row[0] >= 1000]


def run(iterator, limit: int) -> list[dict]:
    out: list[dict] = []
    if limit <= 0:
        return out
    for element in iterator:
        out.append({key: value.numpy() for key, value in element.items()})
        if len(out) == limit:
            break
    return out


def same(got: list[dict], expected: list[dict]) -> bool:
    return len(got) == len(expected) and all(
        set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a) for a, b in zip(got, expected))


@pytest.mark.parametrize("mode", ["pad", "bucket", "pack"])
def test_a_restored_mixture_iterator_delivers_exactly_the_rest(corpora, tmp_path, mode):
    config = mixture_config(corpora, mode)
    make = lambda: Pipeline.from_config(config).iterator()  # noqa: E731
    iterator = make()
    checkpoint = tf.train.Checkpoint(data=iterator)
    full, paths = [], {}
    points = (0, 1, 3, 6, 10)
    while True:
        if len(full) in points:
            paths[len(full)] = checkpoint.write(str(tmp_path / f"after-{len(full)}"))
        try:
            full.append({key: value.numpy() for key, value in next(iterator).items()})
        except StopIteration:
            break
    assert len(full) > max(points), len(full)
    paths[len(full)] = checkpoint.write(str(tmp_path / "at-end"))
    # drop everywhere: each document at most once (pad/bucket truncate and drop the last short batch).
    counts = collections.Counter(first for batch in full for first in first_tokens(batch))
    assert counts and max(counts.values()) == 1
    for k, path in paths.items():
        restored = make()
        tf.train.Checkpoint(data=restored).read(path).assert_consumed()
        assert same(run(restored, len(full)), full[k:]), f"{mode}: restored after batch {k}"


def test_a_repeating_mixture_restored_mid_run_goes_on_exactly_over_two_input_pipelines(corpora, tmp_path):
    config = mixture_config(corpora, "pack", exhausted="repeat", batch_size=16)
    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=8)
        make = lambda: Pipeline.from_config(config).iterator(context)  # noqa: E731
        iterator = make()
        head = run(iterator, 9)
        path = tf.train.Checkpoint(data=iterator).write(str(tmp_path / f"pipeline-{index}"))
        tail = run(iterator, 9)
        restored = make()
        tf.train.Checkpoint(data=restored).read(path).assert_consumed()
        assert head and same(run(restored, 9), tail)


def reweighted(config: DataConfig, weights) -> DataConfig:
    mixture = config.mixture.model_copy(update={"sources": [
        entry.model_copy(update={"weight": weight}) for entry, weight in zip(config.mixture.sources, weights)]})
    return config.model_copy(update={"mixture": mixture})


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_weights_changed_on_resume_continue_every_source_where_it_stopped(corpora, tmp_path, mode, caplog):
    """Restored with new weights: no document twice, none left out (drop: one pass of each source), the
    change logged, and the new weights in force after the window in flight."""
    old = mixture_config(corpora, mode)
    new = reweighted(old, (0.1, 0.1, 0.8))
    iterator = Pipeline.from_config(old).iterator()
    head = run(iterator, 4)
    path = tf.train.Checkpoint(data=iterator).write(str(tmp_path / "old"))
    restored = Pipeline.from_config(new).iterator()
    checkpoint = tf.train.Checkpoint(data=restored)
    checkpoint.read(path).assert_consumed()
    with caplog.at_level("WARNING"):
        tail = run(restored, 1 << 20)
    assert "data.mixture: weights changed since the checkpoint (web 0.5 -> 0.1, code 0.3 -> 0.1, books 0.2 -> 0.8)" \
        in caplog.text
    firsts = [first for batch in head + tail for first in first_tokens(batch)]
    assert len(firsts) == len(set(firsts))  # none twice
    if mode == "pad":  # every document once but the last short batch (drop_remainder)
        assert sum(SOURCES.values()) - len(firsts) < 8
    # The uninterrupted run with the old weights differs after the switch: books come sooner.
    uninterrupted = run(Pipeline.from_config(old).iterator(), len(head) + len(tail))
    books = lambda batches: sum(1 for b in batches for f in first_tokens(b) if f >= 3000)  # noqa: E731
    assert books(tail[:6]) > books(uninterrupted[len(head):len(head) + 6])


def test_a_run_resumed_with_new_weights_resumes_again_exactly(corpora, tmp_path):
    """Checkpointed again before the new weights took effect, and after: each restore is the exact rest."""
    old = mixture_config(corpora, "pack", exhausted="repeat")
    new = reweighted(old, (0.2, 0.2, 0.6))
    first = Pipeline.from_config(old).iterator()
    run(first, 3)
    path = tf.train.Checkpoint(data=first).write(str(tmp_path / "old"))
    second = Pipeline.from_config(new).iterator()
    tf.train.Checkpoint(data=second).read(path).assert_consumed()
    run(second, 1)
    paths = {}
    rest = {}
    for name, count in (("soon", 0), ("later", 12)):
        run(second, count)
        paths[name] = tf.train.Checkpoint(data=second).write(str(tmp_path / name))
        rest[name] = run(second, 6)
    for name, path in paths.items():
        again = Pipeline.from_config(new).iterator()
        tf.train.Checkpoint(data=again).read(path).assert_consumed()
        assert same(run(again, 6), rest[name]), name


def test_the_mixture_example_config_runs_on_the_built_in_corpora(tmp_path, monkeypatch):
    """configs/text_lm_mixture.yaml: both corpora built on first use (HOME moved here), token weights met."""
    import os

    from tpu_pipeline.config import load_config
    from tpu_pipeline.demo import ensure_builtin_data

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TPU_PIPELINE_CACHE", raising=False)
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "text_lm_mixture.yaml")
    ensure_builtin_data(yaml.safe_load(open(path)))
    pipeline = Pipeline.from_config(load_config(path).data)
    weights = [part.weight for part in pipeline.source.parts]
    tokens = pipeline.source.tokens_per_example
    # Example rates ∝ token weight / tokens per example: the long code documents are chosen far less often.
    rates = np.asarray(pipeline.source.weights)
    assert np.allclose(rates * np.asarray(tokens) / np.sum(rates * np.asarray(tokens)), np.asarray(weights) / sum(weights))
    assert rates[1] < rates[0] / 10
    batch = next(iter(pipeline.build()))
    assert batch[0]["inputs"].shape == (16, 256)

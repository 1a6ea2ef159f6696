"""Sources whose records differ: each parsed with its own features and run through its own preprocess ops
before the mixing, so the mixed stream has one shape (the issue's `books` source truncated on its own,
and a source whose token ids are stored under another name, with a title the others lack).
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds

COUNTS = {"web": 60, "code": 40, "books": 28}  # 128: whole batches of 8
FIRST = {"web": 1000, "code": 2000, "books": 3000}  # a source's token ids: FIRST + 0..999
TRUNCATED = 24  # books' own op cuts its documents to this


def record(name: str, tokens: list[int]) -> bytes:
    if name == "code":  # ids under another name, and a title the others do not have
        feature = {"ids": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   "title": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"module.py"]))}
    else:
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def documents(name: str) -> list[list[int]]:
    rng = np.random.default_rng(FIRST[name])
    return [(FIRST[name] + rng.integers(0, 1000, int(rng.integers(1, 60)))).tolist() for _ in range(COUNTS[name])]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("differ")
    for name in COUNTS:
        write_split((record(name, doc) for doc in documents(name)), str(root / name), "train", 2)
    return {name: str(root / name / "train-*") for name in COUNTS}


def section(corpora, mode: str = "pad", parse: str = "auto", code_ops=None, books_ops=None, **extra) -> dict:
    code_ops = code_ops if code_ops is not None else [
        {"op": "cast", "key": "ids", "out_key": "tokens", "dtype": "int32"}, {"op": "keep", "keys": ["tokens"]}]
    books_ops = books_ops if books_ops is not None else [{"op": "truncate", "key": "tokens", "max_length": TRUNCATED}]
    sources = [
        {"name": "web", "weight": 0.5, "exhausted": "drop", "source": {"files": corpora["web"]}},
        {"name": "code", "weight": 0.3, "exhausted": "drop", "source": {"files": corpora["code"]},
         "features": {"ids": {"dtype": "int64", "kind": "ragged"}, "title": {"dtype": "string"}}, "preprocess": code_ops},
        {"name": "books", "weight": 0.2, "exhausted": "drop", "source": {"files": corpora["books"]},
         "preprocess": books_ops},
    ]
    sequence = {"keys": ["tokens"], "length": 64, "mode": mode, "window": 16}
    if mode == "bucket":
        sequence["boundaries"] = [32, 64]
    text = {"mixture": {"sources": sources}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": sequence, "batch_size": 8, "parse": parse, "repeat": 1, "seed": 4,
            "shuffle": {"buffer_size": 16}, **extra}
    return text


def validated(text: dict) -> DataConfig:
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def examples(pipeline: Pipeline) -> list[tuple[int, list[int]]]:
    """(source, tokens) of every example, in order (pad and bucket: a row each; pack: a segment each)."""
    out = []
    for batch in pipeline.build():
        batch = {k: v.numpy() for k, v in batch.items()}
        if "tokens_segment_ids" in batch:  # a row counts its segments of each source: check them by the ids
            for row, segments, counts in zip(batch["tokens"], batch["tokens_segment_ids"], batch["_source_segments"]):
                mine = [(int(row[segments == s][0]) // 1000 - 1, row[segments == s].tolist())
                        for s in range(1, int(segments.max()) + 1)]
                assert np.array_equal(counts, np.bincount([source for source, _ in mine], minlength=3))
                out += mine
            continue
        keep = batch.get("example_mask", np.ones(len(batch["tokens"])))
        for tokens, mask, source, kept in zip(batch["tokens"], batch["tokens_mask"], batch["_source"], keep):
            if kept:
                out.append((int(source), tokens[mask == 1].tolist()))
    return out


@pytest.mark.parametrize("mode,parse", [("pad", "batched"), ("pad", "per_example"), ("bucket", "auto"), ("pack", "auto")])
def test_each_source_is_parsed_and_preprocessed_its_own_way_then_mixed_as_one(corpora, mode, parse):
    extra = {"drop_remainder": False} if mode == "pack" else {}  # rows: the last batch is partial
    pipeline = Pipeline.from_config(validated(section(corpora, mode, parse, **extra)))
    assert pipeline.plan.parse.value == ("batched" if parse == "auto" else parse)
    got = examples(pipeline)
    expected = {0: documents("web"), 1: documents("code"), 2: [doc[:TRUNCATED] for doc in documents("books")]}
    for source, tokens in got:
        assert tokens and {t // 1000 - 1 for t in tokens} == {source}  # its own ids, and its tag, agree
    if mode == "pack":  # rows keep whole documents here (none over 64): compare the multisets of documents
        for source in expected:
            assert sorted(t for s, t in got if s == source) == sorted(expected[source])
    else:  # pad: every document once, in its source's order of the mixed stream; books cut by its own op
        for source in expected:
            mine = [t for s, t in got if s == source]
            assert sorted(map(tuple, mine)) == sorted(map(tuple, expected[source]))
    assert max(len(t) for s, t in got if s == 2) == TRUNCATED
    assert max(len(t) for s, t in got if s == 0) > TRUNCATED  # web's own documents are not cut


def test_a_source_that_ends_with_other_features_is_named_in_one_line(corpora):
    text = section(corpora, code_ops=[{"op": "cast", "key": "ids", "out_key": "tokens", "dtype": "int32"}])
    with pytest.raises(ConfigError) as error:
        Pipeline.from_config(validated(text))
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith("data.mixture.sources[1] (code): after its own features and preprocess its examples have "
                           "ids: RaggedTensor int32, title: Tensor string, where web's have ids: none, title: none"), line


def test_a_random_op_on_one_source_is_refused(corpora):
    text = section(corpora, books_ops=[{"op": "random_flip", "key": "tokens"}])
    with pytest.raises(ConfigError, match=r"^data\.mixture\.sources\[2\]\.preprocess\[0\]: op 'random_flip' is random"):
        Pipeline.from_config(validated(text))


def test_a_restart_gives_the_rest_of_the_stream(corpora):
    """With per-source parsing the stream is still a pure function of its position: a restart after k
    examples is the rest of the uninterrupted one."""
    text = section(corpora, "pad", parse="batched")
    text["mixture"]["sources"] = [dict(entry, exhausted="repeat") for entry in text["mixture"]["sources"]]
    text["repeat"] = "forever"
    pipeline = Pipeline.from_config(validated(text))
    context = tf.distribute.InputContext()
    whole = [b["tokens"].numpy() for b in pipeline.build(context).take(30)]
    for step in (1, 7, 19):
        rest = [b["tokens"].numpy() for b in pipeline.build(context, start=step * 8).take(30 - step)]
        assert all(np.array_equal(a, b) for a, b in zip(rest, whole[step:]))

"""A mixture as evaluation data (`for_evaluation`: sources that drop or stop, one pass, exact steps) and a
mixture of two image datasets (real JPEG bytes) through `Pipeline.from_config` to batches."""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY
from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split

pytestmark = pytest.mark.tf_builds

COUNTS = {"web": 50, "code": 30, "books": 20}
FIRST = {"web": 1000, "code": 2000, "books": 3000}  # document d of a source starts with token FIRST + d
OFFSET = 100_000  # image sources: source s's record i has id s * OFFSET + i


def documents(name: str, count: int):
    rng = np.random.default_rng(FIRST[name])
    for d in range(count):
        tokens = [FIRST[name] + d] + rng.integers(1, 900, size=int(rng.integers(0, 40))).tolist()
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   "id": int_feature(FIRST[name] + d), "x": tf.train.Feature(float_list=tf.train.FloatList(value=[d]))}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("eval_corpora")
    for name, count in COUNTS.items():
        write_split(documents(name, count), str(root / name), "validation", 2)
    return {name: str(root / name / "validation-*.tfrecord") for name in COUNTS}


def eval_config(corpora, exhausted, sequence=None) -> DataConfig:
    entries = [{"name": name, "weight": weight, "exhausted": policy, "source": {"files": corpora[name]}}
               for name, weight, policy in zip(COUNTS, (0.5, 0.3, 0.2), exhausted)]
    text = {"mixture": {"sources": entries}, "batch_size": 8, "repeat": 1, "shuffle": {"enabled": False}, "seed": 4}
    if sequence is None:
        text.update(features={"x": {"dtype": "float32"}, "id": {"dtype": "int64"}}, outputs={"inputs": "x", "targets": "id"})
    else:
        text.update(features={"tokens": {"dtype": "int64", "kind": "ragged"}}, sequence=sequence,
                    outputs={"inputs": ["tokens", "tokens_segment_ids", "tokens_positions"], "targets": "tokens",
                             "weights": "tokens_segment_ids"})
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "eval_data"})


def mixed_ids(pipeline: Pipeline, context: tf.distribute.InputContext) -> list[int]:
    """The documents the mixture's records hold on one input pipeline, in order (its raw stream, parsed)."""
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    records = pipeline.source.build(context).map(lambda element: element[RECORDS_KEY])  # (their sources beside)
    if records.element_spec.shape.rank:
        records = records.unbatch()
    return [int(i) for i in records.map(lambda r: tf.io.parse_single_example(r, spec)["id"]).as_numpy_iterator()]


LAYOUTS = [(1, 1), (2, 8)]  # (input pipelines, replicas)


@pytest.mark.parametrize("exhausted", [("drop", "drop", "drop"), ("drop", "drop", "stop")], ids=["drop", "stop"])
def test_a_packed_mixture_evaluates_every_document_of_its_pass_once_in_the_steps_it_counts(corpora, exhausted):
    sequence = {"keys": ["tokens"], "length": 64, "mode": "pack", "window": 16}
    pipeline = Pipeline.from_config(eval_config(corpora, exhausted, sequence), prefix="eval_data").for_evaluation()
    for hosts, replicas in LAYOUTS:
        steps = pipeline.evaluation_steps(replicas, hosts)
        seen = []
        for host in range(hosts):
            context = tf.distribute.InputContext(hosts, host, replicas)
            elements = list(pipeline.build(context))
            assert len(elements) == steps * replicas // hosts, (hosts, replicas)  # it ends, after the steps counted
            mine = []
            for inputs, targets, weights in elements:
                tokens, segments, positions = (np.asarray(inputs[k]) for k in ("tokens", "tokens_segment_ids",
                                                                                 "tokens_positions"))
                assert np.array_equal(np.asarray(weights), segments > 0)  # padding: segment 0, weight 0
                mine += [int(t) for t, s, p in zip(tokens.ravel(), segments.ravel(), positions.ravel()) if s and p == 0]
            assert sorted(mine) == sorted(mixed_ids(pipeline, context))  # this host's pass, each document once
            seen += mine
        counts = collections.Counter(seen)
        assert counts and max(counts.values()) == 1, "a document twice"
        if exhausted[2] == "drop":  # drop: every document of every source, once
            assert sorted(counts) == sorted(FIRST[n] + d for n, c in COUNTS.items() for d in range(c))
        else:  # stop: the mixture ends at books' first choice past its end; fewer documents, none twice
            assert len(counts) <= sum(COUNTS.values())


@pytest.mark.parametrize("exhausted", [("drop", "drop", "drop"), ("stop", "drop", "stop")], ids=["drop", "stop"])
def test_a_mixture_of_examples_evaluates_every_example_of_its_pass_once_in_the_steps_it_counts(corpora, exhausted):
    pipeline = Pipeline.from_config(eval_config(corpora, exhausted), prefix="eval_data").for_evaluation()
    everything = []
    for hosts, replicas in LAYOUTS:
        steps = pipeline.evaluation_steps(replicas, hosts)
        seen = []
        for host in range(hosts):
            context = tf.distribute.InputContext(hosts, host, replicas)
            expected = mixed_ids(pipeline, context)
            elements = list(pipeline.build(context))
            assert len(elements) == steps * replicas // hosts  # every host the same steps, then the end
            mine = [int(i) for _, ids, weights in elements for i, w in zip(ids, weights) if w == 1]
            assert mine == expected  # every example of the pass once, weight 1; padding weight 0
            assert sum(float(np.sum(w)) for _, _, w in elements) == len(expected)
            seen += mine
        assert len(seen) == len(set(seen))
        everything.append(sorted(seen))
    if "stop" not in exhausted:
        assert everything[0] == sorted(FIRST[n] + d for n, c in COUNTS.items() for d in range(c))


def jpeg_records(source: int, count: int, size: int):
    """Real JPEGs (each source its own size), label = i % 3, id = source * OFFSET + i."""
    rng = np.random.default_rng(source)
    for i in range(count):
        pixels = rng.integers(0, 256, size=(size + int(rng.integers(0, 6)), size, 3), dtype=np.uint8)
        feature = {"image": bytes_feature(tf.io.encode_jpeg(pixels, quality=90).numpy()), "label": int_feature(i % 3),
                   "id": int_feature(source * OFFSET + i)}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def image_sets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("image_mixture")
    sizes = {"small": (60, 20), "large": (40, 36)}  # (images, side)
    for source, (name, (count, side)) in enumerate(sizes.items()):
        write_split(jpeg_records(source, count, side), str(root / name), "train", 3)
    return {name: str(root / name / "train-*.tfrecord") for name in sizes}


def image_config(image_sets, exhausted: str, **extra) -> DataConfig:
    entries = [{"name": name, "weight": weight, "exhausted": exhausted, "source": {"files": files}}
               for (name, files), weight in zip(image_sets.items(), (0.6, 0.4))]
    text = {"mixture": {"sources": entries},
            "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
            "preprocess": [{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 16},
                           {"op": "cast", "key": "image", "dtype": "bfloat16"}],
            "augment": [{"op": "random_flip"}],
            "shuffle": {"buffer_size": 32}, "seed": 1, "batch_size": 8,
            "repeat": "forever" if exhausted == "repeat" else 1, **extra}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def test_an_image_mixture_makes_batches_of_decoded_images_from_both_datasets(image_sets):
    pipeline = Pipeline.from_config(image_config(image_sets, "drop"))
    batches = list(pipeline.build())
    assert batches and all(b["image"].shape == (8, 16, 16, 3) and b["image"].dtype == tf.bfloat16 for b in batches)
    ids = [int(i) for b in batches for i in b["id"]]
    # drop: every image of both datasets once, but the last short batch (drop_remainder)
    assert len(ids) == len(set(ids)) == 96
    assert set(ids) <= {i for i in range(60)} | {OFFSET + i for i in range(40)}
    assert all(int(label) == int(i) % OFFSET % 3 for b in batches for label, i in zip(b["label"], b["id"]))
    pixels = np.asarray(batches[0]["image"], np.float32)
    assert 20 < pixels.mean() < 235 and pixels.std() > 10  # decoded pictures, not zeros


def test_an_image_mixture_that_repeats_follows_its_weights_and_resumes_exactly(image_sets):
    pipeline = Pipeline.from_config(image_config(image_sets, "repeat"))
    batches = list(pipeline.build().take(64))
    ids = [int(i) for b in batches for i in b["id"]]
    small = [i for i in ids if i < OFFSET]
    # The shares are the schedule's: its closed-form counts of the first 512 choices, near 0.6 / 0.4.
    counts = pipeline.source.positions(tf.distribute.InputContext()).taken(len(ids))
    assert [len(small), len(ids) - len(small)] == counts.tolist() and abs(len(small) / len(ids) - 0.6) < 0.05
    assert sorted(small[:60]) == list(range(60))  # the first epoch of the small set: each image once
    resumed = [int(i) for b in pipeline.build(start=8 * 24).take(40) for i in b["id"]]
    assert resumed == ids[8 * 24:]  # the stream restarted at step 24 is the exact rest

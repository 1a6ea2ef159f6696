"""A mixture that ends before the run it feeds: `mixture_check` finds it before the first step, in one line.

Every length the check states is compared with the stream the pipeline really delivers from real
TFRecord sources: the check must refuse exactly the runs the data cannot feed.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf
import yaml

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline
from tpu_pipeline.pipeline.core.element_keys import RECORDS_KEY
from tpu_pipeline.pipeline.mixtures.mixture_check import check_mixture_length, check_training_mixture, training_need
from tpu_pipeline.records.writer import write_split
from tpu_pipeline.testing.data import write_tfrecords

pytestmark = pytest.mark.tf_builds

COUNTS = {"web": 50, "code": 30, "books": 20}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """Three small TFRecord sources (ids 0..n-1, 2 files each)."""
    root = tmp_path_factory.mktemp("mixture_check")
    return {name: write_tfrecords(root / name, {"x": {"dtype": "int64"}}, count, num_shards=2)
            for name, count in COUNTS.items()}


def config(sources, exhausted=("repeat", "repeat", "stop"), weights=(0.5, 0.3, 0.2), batch_size=4, **extra) -> DataConfig:
    entries = [{"name": name, "weight": weight, "exhausted": policy, "source": {"files": sources[name]}}
               for name, weight, policy in zip(COUNTS, weights, exhausted)]
    text = {"mixture": {"sources": entries}, "features": {"id": {"dtype": "int64"}}, "batch_size": batch_size,
            "shuffle": {"buffer_size": 16}, "seed": 2, "repeat": "forever" if "repeat" in exhausted else 1, **extra}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def delivered(pipeline: Pipeline, context=None) -> int:
    """Examples the mixture's records really make on one input pipeline (read to its end)."""
    records = pipeline.source.build(context or tf.distribute.InputContext())
    # Records alone or in blocks (as the plan reads them): count them either way.
    return int(records.reduce(np.int64(0), lambda count, e: count + tf.size(e[RECORDS_KEY], out_type=tf.int64)).numpy())


def test_a_stop_source_too_small_for_the_run_is_named_with_its_records_weight_and_the_fix(sources):
    pipeline = Pipeline.from_config(config(sources))
    length = delivered(pipeline)
    assert 20 <= length < 100  # books' 20 records at 20% end the mixture after about 100 choices
    steps = -(-(length + 1) // 4)  # one example more than it holds: refused
    with pytest.raises(ConfigError) as error:
        check_training_mixture(pipeline, steps_per_epoch=steps, epochs=1, num_input_pipelines=1, num_replicas=1)
    line = str(error.value)
    assert "\n" not in line
    assert line.startswith("data.mixture.sources[2] (books): its 20 records on its one input pipeline (weight 0.2, "
                           "20.0% of the examples) run out first, and with exhausted: stop that ends the mixture after "
                           f"{length} examples, but the run needs {steps * 4} (train.steps_per_epoch={steps} x "
                           "train.epochs=1 steps of 4 examples on this input pipeline)"), line
    assert line.endswith("lower its weight, give it more records, or set its exhausted: drop (it leaves) or repeat")
    # Exactly as many as it holds: accepted, and the stream really holds them.
    check_mixture_length(pipeline, length)
    with pytest.raises(ConfigError, match=f"after {length} examples, but the run needs {length + 1}"):
        check_mixture_length(pipeline, length + 1)


def test_train_would_run_out_where_the_check_says(sources):
    """The check's boundary is the stream's: the steps it accepts all come, the first it refuses does not."""
    pipeline = Pipeline.from_config(config(sources))
    batches = sum(1 for _ in pipeline.build())
    check_training_mixture(pipeline, batches, 1, 1, 1)
    with pytest.raises(ConfigError, match=r"sources\[2\] \(books\)"):
        check_training_mixture(pipeline, batches + 1, 1, 1, 1)
    with pytest.raises(ConfigError, match=r"train.steps_per_epoch=%d x train.epochs=2" % batches):
        check_training_mixture(pipeline, batches, 2, 1, 1)


def test_each_input_pipeline_is_checked_with_its_own_records(sources):
    pipeline = Pipeline.from_config(config(sources, batch_size=8))
    lengths = [delivered(pipeline, tf.distribute.InputContext(2, index, 8)) for index in range(2)]
    assert all(length < 60 for length in lengths)
    for index, length in enumerate(lengths):
        context = tf.distribute.InputContext(2, index, 8)
        check_mixture_length(pipeline, length, context)
        with pytest.raises(ConfigError, match=rf"its 10 records on input pipeline {index} of 2 .* after {length} examples"):
            check_mixture_length(pipeline, length + 1, context)
    # 8 replicas, 2 hosts: a step takes 4 examples from each input pipeline.
    assert training_need(pipeline, tf.distribute.InputContext(2, 0, 8), 5, 3)[0] == 5 * 3 * 4
    steps = min(lengths) // 4 + 1
    with pytest.raises(ConfigError, match=rf"input pipeline {int(np.argmin(lengths))} of 2"):
        check_training_mixture(pipeline, steps, 1, num_input_pipelines=2, num_replicas=8)
    check_training_mixture(pipeline, min(lengths) // 4, 1, num_input_pipelines=2, num_replicas=8)


def test_the_first_stop_source_to_run_out_is_the_one_named(sources):
    """Two stop sources: the one whose first choice past its end comes first in the schedule is named."""
    pipeline = Pipeline.from_config(config(sources, ("stop", "repeat", "stop"), weights=(0.7, 0.1, 0.2)))
    length = delivered(pipeline)
    with pytest.raises(ConfigError) as error:
        check_mixture_length(pipeline, length + 1)
    assert re.match(r"data.mixture.sources\[0\] \(web\): its 50 records", str(error.value)), str(error.value)
    pipeline = Pipeline.from_config(config(sources, ("stop", "repeat", "stop"), weights=(0.3, 0.1, 0.6)))
    with pytest.raises(ConfigError, match=r"^data.mixture.sources\[2\] \(books\): its 20 records .*weight 0.6, 60.0%"):
        check_mixture_length(pipeline, delivered(pipeline) + 1)


def test_sources_that_all_drop_end_after_every_record(sources):
    pipeline = Pipeline.from_config(config(sources, ("drop", "drop", "drop")))
    assert delivered(pipeline) == 100
    check_mixture_length(pipeline, 100)
    with pytest.raises(ConfigError, match=r"^data.mixture: every source ends \(exhausted: drop or stop\), after 100 "
                                          r"examples in all on its one input pipeline \(records there: web 50, code 30, "
                                          r"books 20\), but the run needs 101"):
        check_mixture_length(pipeline, 101)


def test_a_mixture_that_never_ends_and_a_plain_source_pass(sources):
    endless = Pipeline.from_config(config(sources, ("repeat", "drop", "repeat"), batch_size=8))
    check_training_mixture(endless, 10**6, 100, 2, 8)
    check_mixture_length(endless, 10**9)
    plain = DataConfig.model_validate({"source": {"type": "tfrecord", "files": sources["books"]},
                                       "features": {"id": {"dtype": "int64"}}, "batch_size": 64, "repeat": 1},
                                      context={"prefix": "data"})
    check_mixture_length(Pipeline.from_config(plain), 10**6)


def test_without_a_stated_need_a_mixture_must_make_one_batch(sources):
    """A stop mixture shorter than one global batch delivers nothing when the batch drops its remainder."""
    small = Pipeline.from_config(config(sources, batch_size=128))
    assert sum(1 for _ in small.build()) == 0  # what the check prevents: output that looks complete and isn't
    with pytest.raises(ConfigError, match=r"but the run needs 128 \(one global batch of 128: 128 examples on this "
                                          r"input pipeline\); lower its weight"):
        check_mixture_length(small)
    check_mixture_length(Pipeline.from_config(config(sources, batch_size=128, drop_remainder=False)))
    check_mixture_length(Pipeline.from_config(config(sources, batch_size=16)))
    check_mixture_length(small.source)  # a bare source: one example


def documents(name: str, count: int, first: int):
    rng = np.random.default_rng(first)
    for d in range(count):
        tokens = [first + d] + rng.integers(1, 900, size=int(rng.integers(0, 40))).tolist()
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("corpora")
    for (name, count), first in zip(COUNTS.items(), (1000, 2000, 3000)):
        write_split(documents(name, count, first), str(root / name), "train", 2)
    return {name: str(root / name / "train-*.tfrecord") for name in COUNTS}


def packed(corpora, overflow: str, weight_by: str = "examples") -> Pipeline:
    sequence = {"keys": ["tokens"], "length": 32, "mode": "pack", "window": 16, "overflow": overflow}
    return Pipeline.from_config(_packed_config(corpora, sequence, weight_by))


def _packed_config(corpora, sequence, weight_by) -> DataConfig:
    entries = [{"name": name, "weight": weight, "exhausted": policy, "source": {"files": corpora[name]}}
               for name, weight, policy in zip(COUNTS, (0.5, 0.3, 0.2), ("repeat", "repeat", "stop"))]
    text = {"mixture": {"sources": entries, "weight_by": weight_by},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}}, "sequence": sequence, "batch_size": 4,
            "shuffle": {"buffer_size": 16}, "seed": 2, "repeat": "forever"}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


def test_packed_rows_bound_the_examples_only_where_no_example_is_split(corpora):
    """Pack with truncate: a row holds at least one example, so rows needed bound the examples from below
    (and the rows the stream really makes are within it); with split only one example is stated."""
    truncating = packed(corpora, "truncate")
    length = delivered(truncating)
    rows = sum(int(batch["tokens"].shape[0]) for batch in truncating.build())
    assert rows <= length  # the bound is honest: never more rows than examples
    need, why = training_need(truncating, tf.distribute.InputContext(), rows // 4 + 1, 1)
    assert need == (rows // 4 + 1) * 4 and "packed rows" in why
    steps_refused = length // 4 + 1
    with pytest.raises(ConfigError, match=r"sources\[2\] \(books\).*a row holds at least one example"):
        check_training_mixture(truncating, steps_refused, 1, 1, 1)
    splitting = packed(corpora, "split")
    assert training_need(splitting, tf.distribute.InputContext(), 10**6, 1)[0] == 1
    check_training_mixture(splitting, 10**6, 1, 1, 1)


def test_token_weights_say_the_example_share_they_became(corpora):
    pipeline = packed(corpora, "truncate", weight_by="tokens")
    share = pipeline.source.weights[2]
    assert abs(share - 0.2) > 0.001  # the documents differ in length: the example rate moved
    with pytest.raises(ConfigError, match=rf"weight 0.2 by tokens, {share:.1%} of the examples"):
        check_mixture_length(pipeline, delivered(pipeline) + 1)


def test_train_refuses_the_run_before_its_first_step(sources, tmp_path):
    """Through `train` itself: the one line, before any step (so no checkpoint claims a half epoch)."""
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.model import tf_keras
    from tpu_pipeline.train import train

    data = config(sources).model_dump(mode="json", exclude_unset=True)
    data["outputs"] = {"inputs": "id", "targets": "id"}
    run = config_from_dict({"data": data, "train": {"epochs": 1, "steps_per_epoch": 1000, "num_classes": 100,
                                                   "run_dir": str(tmp_path / "run"), "tensorboard": False}})
    model = lambda input_shape, num_classes: tf_keras.Sequential([tf_keras.layers.Dense(num_classes)])  # noqa: E731
    with pytest.raises(ConfigError, match=r"^data\.mixture\.sources\[2\] \(books\): its 20 records"):
        train(run, model_fn=model, printer=lambda line: None)
    assert not (tmp_path / "run" / "checkpoints").exists()

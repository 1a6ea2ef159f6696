"""Autograph leaves our tf.data functions as written and still converts a user's (ops/autograph_rule.py).

A pipeline is traced again for every input pipeline, epoch and resume; autograph's rewriting of our own
functions was a third of a packed mixture's build. The rule must hold both ways: none of our functions
converted while a packed mixture with epochs of their own is built, and a user's op with an `if` on a
tensor (which only autograph can trace) working wherever our code calls it: a registered op, a `keyed`
one, one handed to `MapFeatures` in Python, inside the per-epoch functions tf.data traces.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import yaml
from tensorflow.python.autograph.impl import api as autograph_api

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.ops import keyed, register_op, scoped_ops
from tpu_pipeline.pipeline import ArraySource, MapFeatures, Pipeline, Repeat, Shuffle
from tpu_pipeline.records.writer import write_split

pytestmark = pytest.mark.tf_builds


def tokens_example(tokens: list[int]) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature={"tokens": tf.train.Feature(
        int64_list=tf.train.Int64List(value=tokens))})).SerializeToString()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("autograph")
    rng = np.random.default_rng(3)
    for name in ("web", "code"):
        write_split((tokens_example(rng.integers(1, 90, size=int(rng.integers(2, 20))).tolist()) for _ in range(24)),
                    str(root / name), "train", 2)
    return {name: str(root / name / "train-*.tfrecord") for name in ("web", "code")}


def packed(corpora, ops: list[dict], mixture: bool = True) -> DataConfig:
    """A packed mixture of both corpora, read forever; or (not `mixture`) web's, two epochs of their own."""
    if mixture:
        text = {"mixture": {"sources": [{"name": name, "weight": 0.5, "source": {"files": files}}
                                        for name, files in corpora.items()]}, "repeat": "forever"}
    else:
        text = {"source": {"type": "tfrecord", "files": corpora["web"]}, "repeat": 2}
    text |= {"features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "preprocess": [*ops, {"op": "lm_shift", "key": "tokens"}],
            "sequence": {"keys": ["inputs", "targets"], "length": 16, "mode": "pack", "window": 4, "overflow": "split"},
            "batch_size": 2, "shuffle": {"buffer_size": 8}, "seed": 1}
    return DataConfig.model_validate(yaml.safe_load(yaml.safe_dump(text)), context={"prefix": "data"})


@pytest.fixture
def conversions(monkeypatch) -> list[str]:
    """The modules of the functions autograph converts (rewrites) from here on."""
    converted: list[str] = []
    actual = autograph_api._convert_actual

    def spied(entity, program_ctx):
        converted.append(getattr(entity, "__module__", None) or "?")
        return actual(entity, program_ctx)

    monkeypatch.setattr(autograph_api, "_convert_actual", spied)
    return converted


def first_batches(pipeline: Pipeline, count: int) -> list[dict]:
    return [{key: value.numpy() for key, value in batch.items()} for batch in pipeline.build().take(count)]


def test_a_packed_mixture_is_built_and_read_without_converting_a_function_of_ours(corpora, conversions) -> None:
    batches = first_batches(Pipeline.from_config(packed(corpora, [])), 6)
    assert len(batches) == 6 and batches[0]["inputs"].shape == (2, 16)
    ours = sorted({module for module in conversions if module.startswith("tpu_pipeline")})
    assert not ours, f"autograph rewrote functions of {ours}: tpu_pipeline.pipeline and .ops are traced as written"


def clipped_if_large(tokens: tf.Tensor) -> tf.Tensor:
    """A user's function only autograph can trace: a Python `if` on a tensor."""
    if tf.reduce_max(tokens) > 50:
        tokens = tf.minimum(tokens, 50)
    else:
        tokens = tokens + 0
    return tokens


def test_a_users_op_with_an_if_on_a_tensor_still_works_registered_keyed_and_given_in_python(corpora, conversions) -> None:
    with scoped_ops():
        @register_op("clip_if_large_plain")
        def clip_plain():
            return lambda features, seed=None: {**features, "tokens": clipped_if_large(features["tokens"])}

        @register_op("clip_if_large_keyed")
        @keyed(default_key="tokens")
        def clip_keyed():
            return lambda tokens, seed=None: clipped_if_large(tokens)

        for op in ("clip_if_large_plain", "clip_if_large_keyed"):
            for mixture in (True, False):
                batches = first_batches(Pipeline.from_config(packed(corpora, [{"op": op}], mixture)), 40)
                assert max(int(batch["inputs"].max()) for batch in batches) == 50, (op, mixture)
    assert any(module == __name__ for module in conversions), "the user's functions were not converted"

    arrays = {"tokens": np.arange(40, dtype=np.int64).reshape(10, 4) * 3}
    stages = [MapFeatures(ops=[lambda features, seed=None: {"tokens": clipped_if_large(features["tokens"])}]),
              Shuffle(buffer_size=4, seed=2), Repeat(2)]  # the map runs inside each epoch's own function
    values = [row["tokens"].numpy() for row in Pipeline(ArraySource(arrays), stages).build()]
    assert len(values) == 20 and max(int(value.max()) for value in values) == 50

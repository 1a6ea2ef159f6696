"""The model layer on Keras 3's JAX backend: the Transformer computes what tf_keras computes, its masks
hold, the language model's figures keep their meanings, and every network trains over 8 JAX devices.

Keras picks its backend once per process, so the JAX side runs in a child (`jax_child.run_jax`); the
tf_keras side runs here. The two exchange weights and batches as .npz files in the test's tmp_path,
and the weights are matched by name (`block0_attention/query/kernel`), never by position.
"""
from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from jax_child import requires_jax, run_jax
from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.model import build_network, tf_keras
from tpu_pipeline.model.generate import generate

pytestmark = [pytest.mark.tf_builds, requires_jax]

VOCAB = 50
LENGTH = 16
PROMPT = [5, 9, 2]
BYTE_OFFSET = 3  # ids 0..2 are special tokens, so bits per byte differs from the cross-entropy in bits
ATOL = 1e-4
SMALL = {"width": 32, "depth": 2, "heads": 4}
# Rows of the packed batch: 3, 2 and 2 segments, padding (0) after; the last row is an exact
# evaluation's filler row (all padding, weight 0).
SEGMENTS = np.array([[1] * 5 + [2] * 4 + [3] * 3 + [0] * 4,
                     [1] * 10 + [2] * 6,
                     [1] * 7 + [2] * 3 + [0] * 6,
                     [0] * LENGTH], "int32")
# name → (task, logits width, model.transformer, inputs): "packed" has segment ids and positions, "pad" a
# mask, "bucket" the pad batch cut to 12 tokens into a model of any length, "plain" the token ids alone.
CASES: dict[str, tuple[str, int, dict[str, Any], str]] = {
    "lm": ("language_model", VOCAB, {}, "packed"),
    "lm_bidirectional": ("language_model", VOCAB, {"causal": False}, "packed"),
    "lm_attention_dropout": ("language_model", VOCAB, {"attention_dropout": 0.1, "tie_embeddings": False}, "packed"),
    "classifier": ("classification", 3, {"vocab_size": VOCAB, "pooling": "mean"}, "packed"),
    "lm_pad": ("language_model", VOCAB, {}, "pad"),
    "lm_bucket": ("language_model", VOCAB, {"max_length": LENGTH}, "bucket"),
    "classifier_plain": ("classification", 3, {"vocab_size": VOCAB, "pooling": "first"}, "plain"),
}


def positions(segments: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... restarting at every segment; 0 on padding."""
    out = np.zeros_like(segments)
    for row in range(segments.shape[0]):
        for segment in set(segments[row].tolist()) - {0}:
            where = np.flatnonzero(segments[row] == segment)
            out[row, where] = np.arange(len(where))
    return out


def batches(seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """The batch of every kind of inputs, over the same token ids (0 on padding)."""
    tokens = np.random.default_rng(seed).integers(1, VOCAB, SEGMENTS.shape).astype("int32") * (SEGMENTS > 0)
    mask = (SEGMENTS > 0).astype("int32")
    return {"packed": {"tokens": tokens, "tokens_segment_ids": SEGMENTS, "tokens_positions": positions(SEGMENTS)},
            "pad": {"tokens": tokens, "tokens_mask": mask},
            "bucket": {"tokens": tokens[:, :12], "tokens_mask": mask[:, :12]},
            "plain": {"tokens": tokens}}


def input_shapes(kind: str, batch: dict[str, np.ndarray]) -> dict[str, list]:
    """A bucket-mode model takes any length (None); the others the batch's."""
    return {name: [None if kind == "bucket" else value.shape[1]] for name, value in batch.items()}


def model_config(transformer: dict[str, Any], keras: str = "tf_keras") -> dict[str, Any]:
    return {"architecture": "transformer", "keras": keras, "transformer": {**SMALL, **transformer}}


def tf_keras_logits(tmp_path) -> dict[str, np.ndarray]:
    """Builds every case with tf_keras, saves its weights by name (and the batches) for the JAX child,
    and returns its logits."""
    logits = {}
    inputs = batches()
    np.savez(tmp_path / "batches.npz", **{f"{kind}.{name}": value for kind, batch in inputs.items()
                                          for name, value in batch.items()})
    for case, (task, classes, transformer, kind) in CASES.items():
        tf_keras.utils.set_random_seed(0)
        config = ModelConfig.from_dict(model_config(transformer))
        model = build_network(tf_keras, config, input_shapes(kind, inputs[kind]), classes, task=task)
        weights = {w.name.removesuffix(":0"): w.numpy() for w in model.weights}
        assert len(weights) == len(model.weights), "two weights of one name: they could not be matched by name"
        np.savez(tmp_path / f"{case}.weights.npz", **weights)
        logits[case] = np.asarray(model(inputs[kind], training=False))
        if case == "lm":
            logits["lm_generated"] = np.array(greedy(model))
    return logits


def greedy(model: Any) -> list[int]:
    return generate(model, PROMPT, length=LENGTH, new_tokens=4, temperature=0, tokens_key="tokens")


TRANSFORMER_CHILD = """
    import json, os
    import numpy as np, keras
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model import global_policy
    from tpu_pipeline.model.architectures import build_network
    from tpu_pipeline.model.generate import generate
    from tpu_pipeline.model.tasks import task_named

    work = os.environ["WORK"]
    cases = json.loads(os.environ["CASES"])
    byte_offset = int(os.environ["BYTE_OFFSET"])
    evaluation_data = np.load(os.path.join(work, "eval.npz"))
    stored = np.load(os.path.join(work, "batches.npz"))
    batches = {}
    for key in stored:
        kind, name = key.split(".", 1)
        batches.setdefault(kind, {})[name] = stored[key]

    def build(case, policy="float32"):
        task, classes, section, kind = cases[case]
        config = ModelConfig.from_dict(section)
        with global_policy(keras, policy):
            shapes = {name: [None if kind == "bucket" else value.shape[1]] for name, value in batches[kind].items()}
            model = build_network(keras, config, shapes, classes, task=task)
        weights = dict(np.load(os.path.join(work, case + ".weights.npz")))
        paths = [w.path for w in model.weights]
        assert sorted(paths) == sorted(weights), (sorted(set(paths) ^ set(weights)))
        for w in model.weights:
            w.assign(weights[w.path])
        return model, config, batches[kind]

    def logits(model, batch):
        return np.asarray(model(batch, training=False))

    def changed(batch, segment):
        batch = dict(batch)
        tokens = batch["tokens"].copy()
        tokens[0][batch["tokens_segment_ids"][0] == segment] += 1
        batch["tokens"] = tokens
        return batch

    out = {}
    for case in cases:
        model, config, batch = build(case)
        out[case] = logits(model, batch)
        if case == "lm":
            out["lm_segment1_changed"] = logits(model, changed(batch, 1))
            prompt, length = json.loads(os.environ["PROMPT"]), batch["tokens"].shape[1]
            out["lm_generated"] = np.array(generate(model, prompt, length=length, new_tokens=4, temperature=0,
                                                    tokens_key="tokens"))
            bf16, _, _ = build(case, "mixed_bfloat16")
            out["lm_mixed_bfloat16"] = logits(bf16, batch)
            task = task_named("language_model")
            loss, metrics = task.loss_and_metrics(keras, config, byte_offset)
            model.compile(optimizer="sgd", loss=loss, weighted_metrics=metrics)
            evaluation = model.evaluate(batch, evaluation_data["targets"], sample_weight=evaluation_data["weights"],
                                        batch_size=len(batch["tokens"]), return_dict=True, verbose=0)
            figures = task.evaluation_figures(evaluation)
        if case == "lm_bidirectional":
            out["lm_bidirectional_segment2_changed"] = logits(model, changed(batch, 2))
    np.savez(os.path.join(work, "jax_logits.npz"), **out)
    emit({"figures": figures, "backend": keras.backend.backend()})
"""


def targets_and_weights() -> tuple[np.ndarray, np.ndarray]:
    """Random next-token targets, some special (< BYTE_OFFSET); weight 1 on real tokens but a few, 0 elsewhere."""
    rng = np.random.default_rng(1)
    targets = rng.integers(0, VOCAB, SEGMENTS.shape).astype("int32")
    targets[0, :3] = [0, 1, 2]
    weights = (SEGMENTS > 0).astype("float32")
    weights[1, -2:] = 0.0
    return targets, weights


def expected_figures(logits: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """The figures' meanings in numpy: nats per real (weighted) token, and what follows from them."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    nats = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss = float((nats * weights).sum() / weights.sum())
    bytes_ = float((weights * (targets >= BYTE_OFFSET)).sum())
    return {"eval_loss": loss, "eval_perplexity": math.exp(loss),
            "eval_token_accuracy": float(((logits.argmax(-1) == targets) * weights).sum() / weights.sum()),
            "eval_bits_per_byte": float((nats * weights).sum() / math.log(2.0) / bytes_)}


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    """tf_keras's logits here, then the same networks with the same weights on JAX in one child."""
    work = tmp_path_factory.mktemp("jax_models")
    reference = tf_keras_logits(work)
    targets, weights = targets_and_weights()
    np.savez(work / "eval.npz", targets=targets, weights=weights)
    cases = {case: (task, classes, model_config(transformer, "keras3"), kind)
             for case, (task, classes, transformer, kind) in CASES.items()}
    result = run_jax(TRANSFORMER_CHILD, env={"WORK": str(work), "CASES": json.dumps(cases),
                                             "BYTE_OFFSET": str(BYTE_OFFSET), "PROMPT": json.dumps(PROMPT)})
    return reference, dict(np.load(work / "jax_logits.npz")), result, (targets, weights)


@pytest.mark.parametrize("case", list(CASES))
def test_jax_transformer_computes_what_tf_keras_computes(jax_run, case):
    reference, jax_logits, result, _ = jax_run
    assert result["backend"] == "jax"
    assert jax_logits[case].dtype == np.float32 and jax_logits[case].shape == reference[case].shape
    np.testing.assert_allclose(jax_logits[case], reference[case], atol=ATOL, rtol=0)


def test_jax_language_model_generates_what_tf_keras_generates(jax_run):
    """`generate` feeds a Keras 3 model the inputs it names (segment ids, positions), as it does tf_keras's."""
    reference, jax_logits, _, _ = jax_run
    assert jax_logits["lm_generated"].tolist() == reference["lm_generated"].tolist()
    assert len(reference["lm_generated"]) == 4


def test_jax_attention_keeps_packed_segments_apart(jax_run):
    """Another segment's tokens change nothing, bidirectional or causal (causal alone would let segment 2
    see segment 1); padding sees only itself."""
    _, logits, _, _ = jax_run
    row = SEGMENTS[0]
    moved = np.abs(logits["lm_bidirectional_segment2_changed"][0] - logits["lm_bidirectional"][0]).max(axis=-1)
    assert moved[row == 2].min() > 1e-3
    assert moved[row != 2].max() < 1e-6
    moved = np.abs(logits["lm_segment1_changed"][0] - logits["lm"][0]).max(axis=-1)
    assert moved[row == 1].min() > 1e-3
    assert moved[row != 1].max() < 1e-6
    assert all(np.isfinite(logits[case]).all() for case in CASES)  # the all-padding filler row included


def test_jax_mixed_bfloat16_keeps_float32_logits(jax_run):
    _, logits, _, _ = jax_run
    assert logits["lm_mixed_bfloat16"].dtype == np.float32
    np.testing.assert_allclose(logits["lm_mixed_bfloat16"], logits["lm"], atol=0.1, rtol=0)


def test_jax_language_model_figures_keep_their_meanings(jax_run):
    """eval_loss is nats per real token (weight-0 padding and filler row left out), perplexity its exp,
    bits per byte the bits over the byte targets only: checked against numpy on the JAX model's logits."""
    _, logits, result, (targets, weights) = jax_run
    expected = expected_figures(logits["lm"], targets, weights)
    figures = result["figures"]
    assert set(expected) <= set(figures)
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, rel=1e-5), name
    assert figures["eval_perplexity"] == pytest.approx(math.exp(figures["eval_loss"]), rel=1e-5)


FIT_CHILD = """
    import os, sys
    import jax, keras, numpy as np, tensorflow as tf, yaml
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model.architectures import build_network
    from tpu_pipeline.model.optimizers import build_optimizer
    from tpu_pipeline.model.schedules import build_schedule
    from tpu_pipeline.model.tasks import task_named

    sys.path.insert(0, os.environ["WORK"])  # the user's module named by model.fn
    keras.distribution.set_distribution(
        keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False))
    BATCH, STEPS = 16, 2

    def images(shape, classes):
        rng = np.random.default_rng(0)
        x = rng.random((BATCH * STEPS, *shape), dtype=np.float32)
        y = rng.integers(0, classes, BATCH * STEPS).astype("int32")
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat()

    def tokens(length, vocab):
        rng = np.random.default_rng(0)
        segments = np.repeat(np.array([[1] * (length // 2) + [2] * (length // 4) + [0] * (length // 4)]),
                             BATCH * STEPS, axis=0).astype("int32")
        positions = np.where(segments == 2, np.arange(length) - length // 2, np.arange(length)) * (segments > 0)
        ids = rng.integers(1, vocab, segments.shape).astype("int32") * (segments > 0)
        x = {"tokens": ids, "tokens_segment_ids": segments, "tokens_positions": positions.astype("int32")}
        targets = np.roll(ids, -1, axis=1)
        weights = ((segments > 0) & (np.roll(segments, -1, axis=1) == segments)).astype("float32")
        return tf.data.Dataset.from_tensor_slices((x, targets, weights)).batch(BATCH, drop_remainder=True).repeat()

    def fit(model_section, shape, classes, dataset, task="classification"):
        config = ModelConfig.from_dict({**model_section, "keras": "keras3"})
        task = task_named(task)
        model = build_network(keras, config, shape, classes, task=task)
        optimizer = build_optimizer(keras, config.optimizer, build_schedule(keras, config.schedule, STEPS, 1))
        loss, metrics = task.loss_and_metrics(keras, config, 1 if task.predicts_tokens else None)
        model.compile(optimizer=optimizer, loss=loss, weighted_metrics=metrics)
        history = model.fit(dataset, epochs=1, steps_per_epoch=STEPS, verbose=0).history
        return {"figures": {name: values[-1] for name, values in history.items()},
                "steps": int(optimizer.iterations.numpy()),
                "devices": len(model.trainable_variables[0].value.sharding.device_set),
                "logits_dtype": str(model.outputs[0].dtype)}

    def batch_statistics():
        '''One step of a CNN with batch_norm.synchronized: the moving mean moves toward the mean of the
        whole global batch, not of one device's 2 examples.'''
        config = ModelConfig.from_dict({"architecture": "cnn", "cnn": {"filters": [4]}, "keras": "keras3",
                                        "batch_norm": {"synchronized": True, "momentum": 0.5}})
        model = build_network(keras, config, [8, 8, 3], 4)
        x, y = next(iter(images([8, 8, 3], 4)))
        features = keras.Model(model.inputs, model.get_layer("conv_0").output).predict(x, verbose=0)
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x.numpy(), y.numpy(), batch_size=BATCH, epochs=1, verbose=0)
        moved = np.asarray(model.get_layer("bn_0").moving_mean)
        return {"global": float(np.abs(moved - 0.5 * features.mean(axis=(0, 1, 2))).max()),
                "one_device": float(np.abs(moved - 0.5 * features[:2].mean(axis=(0, 1, 2))).max())}

    with open("configs/demo.yaml") as handle:
        demo = yaml.safe_load(handle)["model"]
    tiny_resnet = {"architecture": "resnet", "resnet": {"width": 8, "blocks_per_stage": [1, 1]},
                   "batch_norm": {"synchronized": True}, "optimizer": {"name": "adamw", "global_clipnorm": 1.0}}
    transformer = {"architecture": "transformer", "transformer": {"width": 32, "depth": 2, "heads": 4},
                   "optimizer": {"name": "adam"}}
    results = {
        "cnn": fit(demo, [32, 32, 3], 4, images([32, 32, 3], 4)),
        "resnet": fit(tiny_resnet, [32, 32, 3], 4, images([32, 32, 3], 4)),
        "application": fit({"application": "MobileNet"}, [32, 32, 3], 4, images([32, 32, 3], 4)),
        "model_fn": fit({"fn": "user_model:build"}, [8, 8, 3], 4, images([8, 8, 3], 4)),
        "mlp": fit({"architecture": "mlp", "mlp": {"hidden_units": [16], "dropout": 0.1}}, [8], 4, images([8], 4)),
        "transformer": fit(transformer, {"tokens": [16], "tokens_segment_ids": [16], "tokens_positions": [16]},
                           20, tokens(16, 20), task="language_model"),
    }
    emit({"results": results, "batch_statistics": batch_statistics(), "devices": len(jax.devices()),
          "distribution": type(keras.distribution.distribution()).__name__})
"""

USER_MODEL = '''
import keras


def build(input_shape, num_classes):
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = keras.layers.Conv2D(8, 3, activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="user_model")
'''


def test_every_network_trains_over_eight_jax_devices(tmp_path):
    """The demo's CNN, an MLP, a ResNet (batch_norm.synchronized: the global batch's statistics on JAX anyway),
    a keras.applications model, the user's model.fn returning a Keras 3 model, and the Transformer LM, each
    compiled with its task's loss and weighted metrics and the configured optimizer, fit 2 steps of a
    tf.data.Dataset under DataParallel over 8 JAX devices."""
    (tmp_path / "user_model.py").write_text(USER_MODEL)
    result = run_jax(FIT_CHILD, env={"WORK": str(tmp_path)})
    assert result["devices"] == 8 and result["distribution"] == "DataParallel"
    for name, outcome in result["results"].items():
        assert outcome["steps"] == 2, name
        assert outcome["devices"] == 8, name  # the weights are replicated over every device
        assert outcome["logits_dtype"] == "float32", name
        assert all(math.isfinite(value) for value in outcome["figures"].values()), (name, outcome)
    assert {"token_accuracy", "perplexity", "bits_per_byte"} <= set(result["results"]["transformer"]["figures"])
    assert {"accuracy", "cross_entropy"} <= set(result["results"]["cnn"]["figures"])
    statistics = result["batch_statistics"]
    assert statistics["global"] < 1e-5 < statistics["one_device"], statistics

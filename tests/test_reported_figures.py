"""Every figure a language-model run reports, recomputed independently: numpy over the same batches.

A figure that is wrong by a constant (nats left in bits' place), by its denominator (padding counted)
or by what it sums over (evaluation filler rows, a token twice) looks plausible in a log. So each one
is recomputed here from the logits of the very model that reported it, on the very batches it saw,
and with targets chosen so that a slip changes the answer (padding positions whose target is exactly
the model's prediction, real positions whose target never is).
"""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.records import read_metadata

from test_text_lm import converted, lm_config

pytestmark = pytest.mark.tf_builds

BYTE_OFFSET = 3  # the byte tokenizer's id of byte 0; ids 0, 1, 2 are pad, EOS, UNK
VOCAB = 259
LENGTH = 16


def _compiled_language_model(learning_rate: float = 0.001):
    """The compiled model `train` builds for a language model (build_model, task language_model)."""
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model import build_model

    config = ModelConfig.from_dict({"architecture": "transformer", "optimizer": {"name": "adam"},
                                    "schedule": {"name": "constant", "learning_rate": learning_rate},
                                    "transformer": {"width": 32, "depth": 1, "heads": 2, "dropout": 0.0}})
    shapes = {"inputs": [LENGTH], "inputs_segment_ids": [LENGTH], "inputs_positions": [LENGTH]}
    tf.keras.utils.set_random_seed(0)
    return build_model(config, strategy=tf.distribute.get_strategy(), kind="cpu", input_shape=shapes,
                       num_classes=VOCAB, steps_per_epoch=None, epochs=1, task="language_model",
                       byte_offset=BYTE_OFFSET)


def _packed_batch(seed: int = 0) -> tuple[dict, np.ndarray]:
    """Two packed rows: segments of 5 and 7 tokens then 4 padding slots, and one full row. (inputs, weights)."""
    rng = np.random.default_rng(seed)
    segments = np.array([[1] * 5 + [2] * 7 + [0] * 4, [1] * LENGTH], np.int32)
    positions = np.array([list(range(5)) + list(range(7)) + [0] * 4, list(range(LENGTH))], np.int32)
    tokens = np.where(segments > 0, rng.integers(BYTE_OFFSET, VOCAB, size=segments.shape), 0).astype(np.int32)
    inputs = {"inputs": tokens, "inputs_segment_ids": segments, "inputs_positions": positions}
    return inputs, (segments > 0).astype(np.float32)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _figures(logits: np.ndarray, targets: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """Per real token, in numpy: accuracy, nats, perplexity and bits per UTF-8 byte (targets that are bytes)."""
    nats = -np.take_along_axis(_log_softmax(logits), targets[..., None].astype(np.int64), axis=-1)[..., 0]
    weights = weights.astype(np.float64)
    total = weights.sum()
    correct = (logits.argmax(axis=-1) == targets).astype(np.float64)
    byte_targets = (weights * (targets >= BYTE_OFFSET)).sum()
    mean_nats = float((weights * nats).sum() / total)
    return {"token_accuracy": float((weights * correct).sum() / total), "cross_entropy": mean_nats,
            "perplexity": math.exp(mean_nats),
            # bits per byte = nats per token / ln 2 × tokens per byte
            "bits_per_byte": mean_nats / math.log(2.0) * float(total / byte_targets)}


def test_token_accuracy_never_counts_padding_even_where_its_target_is_the_prediction():
    """Every real token wrong and every padding slot's target equal to the model's argmax: 0.0, in
    evaluation and in a training step, as `train` feeds them ((inputs, targets, weights) batches)."""
    model = _compiled_language_model(learning_rate=1e-30)  # a training step leaves the weights as they are
    inputs, weights = _packed_batch()
    predicted = np.asarray(model(inputs, training=False)).argmax(axis=-1).astype(np.int32)
    real = weights > 0
    wrong = np.where(real, (predicted + 1) % VOCAB, predicted)
    right = np.where(real, predicted, (predicted + 1) % VOCAB)
    assert real.sum() < real.size  # there is padding to count by mistake

    def dataset(targets):
        return tf.data.Dataset.from_tensors((inputs, targets, weights))

    for targets, expected in ((wrong, 0.0), (right, 1.0)):
        evaluated = model.evaluate(dataset(targets), verbose=0, return_dict=True)
        assert evaluated["token_accuracy"] == expected, (expected, evaluated)
        trained = model.fit(dataset(targets), epochs=1, verbose=0).history
        assert trained["token_accuracy"] == [expected], (expected, trained)


def test_cross_entropy_perplexity_and_bits_per_byte_are_per_real_token_and_byte():
    """bits per byte = nats per token / ln 2 × tokens per byte, with EOS targets (not bytes) among the
    tokens so that tokens per byte is not 1, and padding holding targets of its own."""
    model = _compiled_language_model()
    inputs, weights = _packed_batch(seed=1)
    logits = np.asarray(model(inputs, training=False))
    rng = np.random.default_rng(2)
    targets = rng.integers(BYTE_OFFSET, VOCAB, size=weights.shape).astype(np.int32)
    targets[0, 4] = targets[0, 11] = targets[1, 15] = 1  # each document's last target is EOS
    targets[weights == 0] = logits.argmax(axis=-1)[weights == 0]  # padding: the prediction itself
    expected = _figures(logits, targets, weights)
    assert expected["bits_per_byte"] > expected["cross_entropy"] / math.log(2.0) * 1.05  # EOS is not a byte

    got = model.evaluate(tf.data.Dataset.from_tensors((inputs, targets, weights)), verbose=0, return_dict=True)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5), name


def _records(data_dir: str, split: str) -> list[list[int]]:
    """Every document's token ids (EOS last) of a converted split, read from its TFRecords."""
    metadata = read_metadata(data_dir)
    documents = []
    for name in metadata["splits"][split]["files"]:
        for raw in tf.data.TFRecordDataset(os.path.join(data_dir, name), compression_type=metadata["compression"]):
            example = tf.train.Example.FromString(raw.numpy())
            documents.append(list(example.features.feature["tokens"].int64_list.value))
    return documents


def _per_document(model, documents: list[list[int]], length: int) -> dict[str, float]:
    """The evaluation figures computed without packing: one document per row (segment 1, positions
    from 0), its next-token pairs only, each document once."""
    rows = len(documents)
    tokens, segments, positions = (np.zeros([rows, length], np.int32) for _ in range(3))
    targets, weights = np.zeros([rows, length], np.int32), np.zeros([rows, length], np.float32)
    for row, ids in enumerate(documents):
        pairs = len(ids) - 1
        assert 0 < pairs <= length, "each validation document fits one row whole"
        tokens[row, :pairs], targets[row, :pairs] = ids[:-1], ids[1:]
        segments[row, :pairs], positions[row, :pairs], weights[row, :pairs] = 1, np.arange(pairs), 1.0
    logits = np.asarray(model({"inputs": tokens, "inputs_segment_ids": segments, "inputs_positions": positions},
                              training=False))
    return _figures(logits, targets, weights)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`train` with the learning rate at ~0, so the weights stay those of the checkpoint and every step's
    logits can be recomputed: (its metrics, the model, the training batches as train built them, the
    converted data's directory, the row length, steps per epoch, epochs)."""
    from tpu_pipeline.pipeline import Pipeline
    from tpu_pipeline.train import train
    from tpu_pipeline.train.runner import load_model

    tmp_path = tmp_path_factory.mktemp("figures")
    length, steps, epochs = 160, 3, 2  # every document (at most ~150 tokens) fits one row whole
    data_dir = converted(tmp_path, count=140)
    raw = lm_config(data_dir, str(tmp_path / "run"), length=length, epochs=epochs, steps=steps, seed=5)
    raw["cluster"] = {"cpu_replicas": 1}
    raw["model"]["schedule"]["learning_rate"] = 1e-30
    raw["model"]["transformer"]["dropout"] = 0.0
    raw["eval_data"]["batch_size"] = 4  # the validation rows do not fill the last batch
    config = config_from_dict(raw)
    metrics = train(config, printer=lambda line: None)
    model = load_model(config)
    # The training stream as train builds it (a pure function of the seed), and a prefetch buffer's worth more.
    batches = list(Pipeline.from_config(config.data).build().take(steps * epochs + 32).as_numpy_iterator())
    return {"metrics": metrics, "model": model, "batches": batches, "data_dir": data_dir, "length": length,
            "steps": steps, "epochs": epochs}


def _last_epoch(trained) -> dict[str, float]:
    """The training figures of the last epoch (Keras resets its metrics at each epoch), in numpy."""
    steps, epochs = trained["steps"], trained["epochs"]
    last_epoch = trained["batches"][steps * (epochs - 1): steps * epochs]
    model = trained["model"]
    logits = np.concatenate([np.asarray(model(inputs, training=False)) for inputs, _, _ in last_epoch])
    targets = np.concatenate([targets for _, targets, _ in last_epoch])
    weights = np.concatenate([weights for _, _, weights in last_epoch])
    assert 0 < weights.mean() < 0.995, "the rows must hold padding for its counting to matter"
    return _figures(logits, targets, weights)


def test_every_figure_train_reports_matches_numpy_over_the_same_batches(trained):
    """Each training figure of the last epoch against numpy over that epoch's batches; each evaluation
    figure against numpy over the validation documents one per row, every document once (packed rows,
    a padded last batch and filler rows must change nothing); non-padding against the batches."""
    metrics = trained["metrics"]
    expected = _last_epoch(trained)
    for name in ("token_accuracy", "perplexity", "bits_per_byte"):
        assert metrics[name] == pytest.approx(expected[name], rel=1e-4), name
        assert metrics["history"][name][-1] == metrics[name]

    # non-padding: real tokens / slots of what the pipeline delivered: the trained batches, and at most
    # the few a prefetch buffer held at the end
    batches, trained_batches = trained["batches"], trained["steps"] * trained["epochs"]
    real = np.cumsum([(inputs["inputs_segment_ids"] > 0).sum() for inputs, _, _ in batches])
    slots = np.cumsum([inputs["inputs_segment_ids"].size for inputs, _, _ in batches])
    fractions = (real / slots)[trained_batches - 1:]
    assert np.isclose(fractions, metrics["non_padding_fraction"], rtol=0, atol=1e-9).any(), (
        metrics["non_padding_fraction"], fractions)

    documents = _records(trained["data_dir"], "validation")
    assert metrics["eval_examples"] == len(documents)
    evaluation = _per_document(trained["model"], documents, trained["length"])
    for name, value in (("eval_loss", evaluation["cross_entropy"]), ("eval_token_accuracy", evaluation["token_accuracy"]),
                        ("eval_perplexity", evaluation["perplexity"]), ("eval_bits_per_byte", evaluation["bits_per_byte"])):
        assert metrics[name] == pytest.approx(value, rel=1e-4), name
    epochs = trained["epochs"]
    for name in ("val_loss", "val_token_accuracy", "val_perplexity", "val_bits_per_byte"):
        assert metrics["history"][name] == pytest.approx([metrics["eval_" + name[4:]]] * epochs, rel=1e-5), name


def test_the_training_loss_train_reports_is_nats_per_real_token(trained):
    """perplexity = exp(loss) per real target token, as for the evaluation's loss."""
    metrics, expected = trained["metrics"], _last_epoch(trained)
    assert metrics["loss"] == pytest.approx(expected["cross_entropy"], rel=1e-4), (metrics["loss"], expected)
    assert metrics["history"]["loss"][-1] == metrics["loss"]


def test_evaluation_figures_on_eight_replicas_count_each_document_once(trained, eight_replica_strategy):
    """train's evaluation as on an 8-core TPU: the exact pass (packed rows, the last batch padded
    with empty rows) through `model.evaluate` over 8 replicas, whose metric totals are summed across replicas."""
    from tpu_pipeline.config.model import ModelConfig
    from tpu_pipeline.model import build_model
    from tpu_pipeline.pipeline import Pipeline

    length = trained["length"]
    section = lm_config(trained["data_dir"], "unused", length=length)["eval_data"]
    section["batch_size"] = 16  # 2 rows a replica: the validation rows fill one step and part of another
    pipeline = Pipeline.from_config(config_from_dict({"data": section}).data).for_evaluation()
    config = ModelConfig.from_dict({"architecture": "transformer", "optimizer": {"name": "adam"},
                                    "schedule": {"name": "constant", "learning_rate": 0.001},
                                    "transformer": {"width": 32, "depth": 1, "heads": 2, "dropout": 0.0}})
    shapes = {"inputs": [length], "inputs_segment_ids": [length], "inputs_positions": [length]}
    tf.keras.utils.set_random_seed(1)
    model = build_model(config, strategy=eight_replica_strategy, kind="cpu", input_shape=shapes, num_classes=VOCAB,
                        steps_per_epoch=None, epochs=1, task="language_model", byte_offset=BYTE_OFFSET)
    got = model.evaluate(pipeline.distribute(eight_replica_strategy), steps=pipeline.evaluation_steps(8),
                         verbose=0, return_dict=True)
    expected = _per_document(model, _records(trained["data_dir"], "validation"), length)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-4), name

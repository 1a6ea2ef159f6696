"""The Transformer (`model.architecture: transformer`) on packed, padded and plain token batches.

A packed row must compute, token for token, what each of its examples computes alone; padding and
the other examples of the row must change neither the logits nor the gradients; a language model
must be causal; the logits stay float32 under a mixed policy. Tiny sizes, float32, CPU.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model import build_network, get_keras, global_policy, tf_keras

pytestmark = pytest.mark.tf_builds

VOCAB = 13
LENGTH = 16
LENGTHS = (5, 4, 3)  # one packed row: 12 tokens, then 4 of padding
ATOL = 1e-5


def config(**transformer) -> ModelConfig:
    return ModelConfig.from_dict({"architecture": "transformer",
                                  "transformer": {"width": 16, "depth": 2, "heads": 2, **transformer}})


def packed_shapes(length=LENGTH) -> dict:
    return {"tokens": [length], "tokens_segment_ids": [length], "tokens_positions": [length]}


def language_model(cfg=None, shapes=None, keras=tf_keras):
    return build_network(keras, cfg or config(), shapes or packed_shapes(), VOCAB, task="language_model")


def encoder(pooling="mean", shapes=None, **transformer):
    cfg = config(vocab_size=VOCAB, pooling=pooling, **transformer)
    return build_network(tf_keras, cfg, shapes or packed_shapes(), 3, task="classification")


def hidden_states(model):
    """The encoder's per-token output (after the final norm), with the model's weights."""
    return tf_keras.Model(model.inputs, model.get_layer("final_norm").output)


def make_examples(seed=0, lengths=LENGTHS) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, n).astype("int32") for n in lengths]


def pack(examples, length=LENGTH) -> dict:
    """One row: the examples one after another, segment ids 1, 2, ..., positions restarting; then padding."""
    tokens, segments, positions = (np.zeros((1, length), "int32") for _ in range(3))
    start = 0
    for i, example in enumerate(examples):
        end = start + len(example)
        tokens[0, start:end], segments[0, start:end], positions[0, start:end] = example, i + 1, np.arange(len(example))
        start = end
    return {"tokens": tokens, "tokens_segment_ids": segments, "tokens_positions": positions}


def alone(examples, length=LENGTH) -> dict:
    """One row per example, each at the start of its own row."""
    rows = [pack([example], length) for example in examples]
    return {key: np.concatenate([row[key] for row in rows]) for key in rows[0]}


def spans(examples) -> list[slice]:
    ends = np.cumsum([len(e) for e in examples])
    return [slice(end - len(e), end) for e, end in zip(examples, ends)]


def run(model, batch) -> np.ndarray:
    return np.asarray(model(batch, training=False))


# --- packing: a row of several examples is each example alone -------------------------------------


def assert_packed_equals_alone(model, examples):
    packed, single = run(model, pack(examples)), run(model, alone(examples))
    for i, span in enumerate(spans(examples)):
        np.testing.assert_allclose(packed[0, span], single[i, :len(examples[i])], atol=ATOL)
    assert not np.allclose(single[0, 0], single[1, 0], atol=1e-3)  # the examples' outputs differ: not vacuous


def test_a_packed_row_gives_the_language_model_each_examples_logits_alone():
    model = language_model()
    assert model.output_shape == (None, LENGTH, VOCAB)
    assert_packed_equals_alone(model, make_examples())


def test_a_packed_row_gives_the_encoder_each_examples_hidden_states_alone():
    assert_packed_equals_alone(hidden_states(encoder()), make_examples(seed=1))


# --- padding and the other examples of the row change nothing -------------------------------------


def garbage_padding(batch, seed=7) -> dict:
    """Other token ids and positions where segment ids are 0."""
    rng = np.random.default_rng(seed)
    changed = {key: value.copy() for key, value in batch.items()}
    padding = batch["tokens_segment_ids"] == 0
    changed["tokens"][padding] = rng.integers(0, VOCAB, padding.sum())
    changed["tokens_positions"][padding] = rng.integers(0, LENGTH, padding.sum())
    return changed


def test_padding_and_another_example_change_no_real_tokens_logits():
    model, examples = language_model(), make_examples()
    batch = pack(examples)
    changed = garbage_padding(batch)
    last = spans(examples)[-1]
    changed["tokens"][0, last] = (batch["tokens"][0, last] + 1) % VOCAB  # another example of the row
    before, after = run(model, batch), run(model, changed)
    kept = spans(examples)[-1].start
    np.testing.assert_allclose(after[0, :kept], before[0, :kept], atol=ATOL)
    assert not np.allclose(after[0, last], before[0, last], atol=1e-3)


def weighted_loss_gradients(model, batch, targets, weights) -> list[np.ndarray]:
    with tf.GradientTape() as tape:
        logits = model(batch, training=True)
        per_token = tf_keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)
        loss = tf.reduce_sum(per_token * weights) / tf.reduce_sum(weights)
    return [np.asarray(tf.convert_to_tensor(g)) for g in tape.gradient(loss, model.trainable_variables)]  # dense slices


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_padding_changes_no_gradient(tie_embeddings):
    model = language_model(config(tie_embeddings=tie_embeddings))
    batch = pack(make_examples())
    targets = np.random.default_rng(3).integers(0, VOCAB, (1, LENGTH)).astype("int32")
    weights = (batch["tokens_segment_ids"] != 0).astype("float32")
    before = weighted_loss_gradients(model, batch, targets, weights)
    after = weighted_loss_gradients(model, garbage_padding(batch), targets, weights)
    assert len(before) == len(model.trainable_variables) and all(g is not None for g in before)
    for variable, g_before, g_after in zip(model.trainable_variables, before, after):
        np.testing.assert_allclose(g_after, g_before, atol=1e-6, err_msg=variable.name)


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_padding_changes_no_pooled_logits_whatever_the_length(pooling):
    # Bucket mode: the length varies per batch, the position table is max_length long.
    model = encoder(pooling, shapes={"tokens": [None], "tokens_mask": [None]}, max_length=LENGTH)
    example = make_examples(lengths=(5,))[0]
    short = {"tokens": np.zeros((1, 8), "int32"), "tokens_mask": np.zeros((1, 8), "int32")}
    short["tokens"][0, :5], short["tokens_mask"][0, :5] = example, 1
    long = {"tokens": np.random.default_rng(5).integers(0, VOCAB, (1, LENGTH)).astype("int32"),
            "tokens_mask": np.zeros((1, LENGTH), "int32")}
    long["tokens"][0, :5], long["tokens_mask"][0, :5] = example, 1
    np.testing.assert_allclose(run(model, long), run(model, short), atol=ATOL)


# --- causality ------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [None, False])
def test_a_later_token_changes_no_earlier_logits_of_a_language_model(causal):
    model = language_model(config(causal=causal))
    batch = alone(make_examples(lengths=(6,)))
    changed = {key: value.copy() for key, value in batch.items()}
    changed["tokens"][0, 3] = (batch["tokens"][0, 3] + 1) % VOCAB
    before, after = run(model, batch), run(model, changed)
    assert not np.allclose(after[0, 3:6], before[0, 3:6], atol=1e-3)
    if causal is None:  # a language model is causal by default
        np.testing.assert_allclose(after[0, :3], before[0, :3], atol=ATOL)
    else:  # model.transformer.causal: false sees the whole example
        assert not np.allclose(after[0, :3], before[0, :3], atol=1e-3)


# --- precision, parameters, other input forms -----------------------------------------------------


def test_mixed_bfloat16_keeps_the_logits_float32_and_close():
    reference = language_model()
    with global_policy(tf_keras, "mixed_bfloat16"):
        model = language_model()
    assert model.get_layer("block0_mlp_in").compute_dtype == "bfloat16"
    assert model.outputs[0].dtype == tf.float32
    model.set_weights(reference.get_weights())
    batch = pack(make_examples())
    logits = model(batch, training=False)
    assert logits.dtype == tf.float32
    expected = run(reference, batch)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=0.05 * np.abs(expected).max())  # bfloat16: ~1%


def test_mixed_float16_classifier_ignores_garbage_padding():
    with global_policy(tf_keras, "mixed_float16"):
        model = encoder()
    batch = pack(make_examples(lengths=(7,)))
    before, after = run(model, batch), run(model, garbage_padding(batch))
    assert before.dtype == np.float32 and np.isfinite(before).all()
    np.testing.assert_allclose(after, before, atol=1e-3)


def expected_parameters(width, depth, vocab, length, tied, mlp=None) -> int:
    mlp = mlp or 4 * width
    block = 2 * 2 * width + 4 * (width * width + width) + (width * mlp + mlp) + (mlp * width + width)
    head = 0 if tied else width * vocab + vocab
    return vocab * width + length * width + depth * block + 2 * width + head


def test_tied_embeddings_save_the_vocabulary_matrix():
    tied, untied = language_model(config(tie_embeddings=True)), language_model(config(tie_embeddings=False))
    assert tied.count_params() == expected_parameters(16, 2, VOCAB, LENGTH, tied=True)
    assert untied.count_params() == expected_parameters(16, 2, VOCAB, LENGTH, tied=False)
    assert untied.count_params() - tied.count_params() == 16 * VOCAB + VOCAB
    assert len({id(v) for v in tied.trainable_variables}) == len(tied.trainable_variables)
    cfg = ModelConfig.from_dict({"architecture": "transformer", "transformer": {"width": 128, "depth": 2, "heads": 4}})
    model = build_network(tf_keras, cfg, packed_shapes(256), 259, task="language_model")
    assert model.count_params() == expected_parameters(128, 2, 259, 256, tied=False) == 496131  # the text demo's


# --- what the language model starts from (benchmarks/bench_lm_quality.py measured why) ------------


def test_the_default_language_model_has_its_own_output_matrix_and_embeddings_from_n_0_002():
    # Tied without a scale learned ~0.2 nats/token worse than a plain Keras model on the text demo.
    cfg = ModelConfig.from_dict({"architecture": "transformer", "transformer": {"width": 128, "depth": 1, "heads": 4}})
    model = build_network(tf_keras, cfg, packed_shapes(256), 259, task="language_model")
    logits = model.get_layer("logits")
    assert isinstance(logits, tf_keras.layers.Dense) and logits.kernel.shape == (128, 259)
    assert not any("token_embedding_scale" in layer.name for layer in model.layers)
    for name in ("token_embedding", "position_embedding"):
        table = model.get_layer(name).embeddings.numpy()
        assert abs(table.mean()) < 0.002 and 0.018 < table.std() < 0.022, (name, table.std())


def test_tied_embeddings_enter_scaled_by_sqrt_width_and_leave_unscaled():
    # Gemma's scale: the blocks see E[token] * sqrt(width); the logits are h . E^T with the same E.
    model = language_model(config(tie_embeddings=True))
    batch = pack(make_examples())
    table = model.get_layer("token_embedding").embeddings.numpy()
    positions = model.get_layer("position_embedding").embeddings.numpy()
    embedded = tf_keras.Model(model.inputs, model.get_layer("embeddings").output)(batch).numpy()
    expected = table[batch["tokens"]] * np.sqrt(16) + positions[batch["tokens_positions"]]
    np.testing.assert_allclose(embedded, expected, atol=ATOL)
    hidden = hidden_states(model)(batch).numpy()
    np.testing.assert_allclose(run(model, batch), hidden @ table.T, atol=1e-4)


def test_pad_mode_masks_and_plain_token_ids_match_the_packed_model():
    packed = language_model()
    padded = language_model(shapes={"tokens": [LENGTH], "tokens_mask": [LENGTH]})
    plain = build_network(tf_keras, config(), [LENGTH], VOCAB, task="language_model")  # one tensor: the ids
    padded.set_weights(packed.get_weights())
    plain.set_weights(packed.get_weights())
    examples = make_examples()
    single = alone(examples)
    expected = run(packed, single)
    masked = run(padded, {"tokens": single["tokens"], "tokens_mask": (single["tokens_segment_ids"] > 0).astype("int32")})
    for i, example in enumerate(examples):
        np.testing.assert_allclose(masked[i, :len(example)], expected[i, :len(example)], atol=ATOL)
    full = alone(make_examples(lengths=(LENGTH,)))
    np.testing.assert_allclose(run(plain, full["tokens"]), run(packed, full), atol=ATOL)


def test_keras3_builds_the_same_transformer():
    keras3 = get_keras("keras3")  # Keras 3 ships with TensorFlow 2.16+: its absence is a failure, not a skip
    model = language_model(ModelConfig.from_dict({"architecture": "transformer", "keras": "keras3", "transformer": {
        "width": 16, "depth": 1, "heads": 2, "attention_dropout": 0.1, "tie_embeddings": True}}),
        keras=keras3)
    assert isinstance(model, keras3.Model) and model.outputs[0].dtype == "float32"
    assert model.count_params() == expected_parameters(16, 1, VOCAB, LENGTH, tied=True)
    assert_packed_equals_alone(model, make_examples())


def test_model_fn_receives_the_dict_of_input_shapes():
    calls = []

    def mine(input_shape, num_classes, task):
        calls.append((input_shape, num_classes, task))
        inputs = {name: tf_keras.Input(shape=shape, dtype="int32", name=name) for name, shape in input_shape.items()}
        x = tf_keras.layers.Embedding(num_classes, 4)(inputs["tokens"])
        return tf_keras.Model(inputs, tf_keras.layers.Dense(num_classes)(x))

    model = build_network(tf_keras, ModelConfig(), packed_shapes(None), VOCAB, mine, task="language_model")
    assert calls == [({"tokens": [None], "tokens_segment_ids": [None], "tokens_positions": [None]}, VOCAB,
                      "language_model")]
    assert model.output_shape == (None, None, VOCAB)


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("build, message", [
    (lambda: config(width=16, heads=3), r"model\.transformer\.heads=3 must divide model\.transformer\.width=16"),
    (lambda: language_model(shapes={"a": [8], "b": [8], "a_segment_ids": [8]}),
     r"model\.transformer\.tokens_key: cannot tell .* \['a', 'b', 'a_segment_ids'\]; .* one of \['a', 'b'\]"),
    (lambda: language_model(config(tokens_key="ids")), r"model\.transformer\.tokens_key='ids' is not an input"),
    (lambda: build_network(tf_keras, config(), packed_shapes(), 3), r"set model\.transformer\.vocab_size"),
    (lambda: language_model(shapes=packed_shapes(None)), r"set model\.transformer\.max_length"),
    (lambda: language_model(config(max_length=8)), r"model\.transformer\.max_length=8 is shorter .* 16"),
    (lambda: language_model(config(vocab_size=20, tie_embeddings=True)),
     r"vocab_size=20 differs .*tie_embeddings: false"),
    (lambda: build_network(tf_keras, config(), packed_shapes(), 1, task="language_model"),
     r"num_classes: a language model's logits are its vocabulary"),
    (lambda: build_network(tf_keras, ModelConfig.from_dict({"architecture": "cnn"}), packed_shapes(), 3),
     r"model\.architecture='cnn' takes one input tensor, but the inputs are a dict"),
    (lambda: build_network(tf_keras, ModelConfig.from_dict({"architecture": "mlp"}), [8], 3, task="language_model"),
     r"train\.task='language_model' needs model\.architecture: transformer"),
])
def test_mistakes_are_one_line_config_errors(build, message):
    with pytest.raises(ConfigError, match=message) as error:
        build()
    assert "\n" not in str(error.value)

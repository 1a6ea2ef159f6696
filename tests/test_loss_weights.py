"""Loss on some tokens only: a `loss_weights` feature beside the tokens (1 on an answer's tokens, 0 on its prompt),
as instruction and chat data carry (issue 50, items 3 and 4).

`lm_shift` makes it each target's weight (`weights[1:]`); pack, pad and bucket carry it row for row with the
targets; the derived outputs weigh the loss and metrics by it; and the language model's figures count the
weighted tokens only. A mask one token off trains the model on the prompt, and looks fine in a log, so every
check here is one such a shift breaks: each token's weight is a function of the token itself (its parity), and
the figures are recomputed by plain Keras over the same logits.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS, OpConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import build_ops
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records.writer import write_split

from test_reported_figures import _compiled_language_model, _figures, _packed_batch

pytestmark = pytest.mark.tf_builds

LENGTH = 32
NUM = 120


def weight_of(token: int) -> int:
    """The weight each token carries in these records: its parity, so a weight read one token off is wrong about
    half the time."""
    return token % 2


def documents() -> list[list[int]]:
    rng = np.random.default_rng(5)
    # 0 to 80 tokens: empty and one-token documents (no pair), and some longer than a row (split or truncated)
    return [rng.integers(3, 250, size=int(n)).tolist() for n in rng.integers(0, 81, size=NUM)]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("loss_weights")

    def example(tokens: list[int]) -> bytes:
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   LOSS_WEIGHTS: tf.train.Feature(int64_list=tf.train.Int64List(value=[weight_of(t) for t in tokens]))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split((example(tokens) for tokens in documents()), str(root), "train", 3)
    return str(root / "train-*.tfrecord")


def lm_shift(**arguments):
    (fn,), _ = build_ops([OpConfig.model_validate({"op": "lm_shift", **arguments})], "data.preprocess")
    return fn


def apart(out: dict) -> dict:
    """lm_shift's `weighted_targets` (2 * id + weight) as `targets` and `loss_weights`, taken apart by hand."""
    out = dict(out)
    values = out.pop("weighted_targets")
    plain = values.to_list() if isinstance(values, tf.RaggedTensor) else values.numpy().tolist()
    halve = lambda v: [halve(x) for x in v] if isinstance(v, list) else v // 2  # noqa: E731
    parity = lambda v: [parity(x) for x in v] if isinstance(v, list) else v % 2  # noqa: E731
    return {**out, "targets": halve(plain), LOSS_WEIGHTS: parity(plain)}


def test_lm_shift_makes_each_targets_weight_that_of_its_token():
    """The weights given beside the tokens, or inside them (`weighted_tokens`, what convert --from chat writes):
    either way each target leaves with its token's weight inside it, `weighted_targets`."""
    shift = lm_shift()
    one = apart(shift({"tokens": tf.constant([5, 6, 7, 8]), LOSS_WEIGHTS: tf.constant([0, 0, 1, 1])}))
    assert one["targets"] == [6, 7, 8] and one[LOSS_WEIGHTS] == [0, 1, 1] and set(one) == {"inputs", "targets",
                                                                                          LOSS_WEIGHTS}
    assert one["inputs"].numpy().tolist() == [5, 6, 7]
    tokens, weights = [[5, 6, 7], [9], [], [1, 2]], [[1, 0, 1], [1], [], [0, 1]]
    batch = apart(shift({"tokens": tf.ragged.constant(tokens), LOSS_WEIGHTS: tf.ragged.constant(weights)}))
    assert batch["targets"] == [[6, 7], [], [], [2]] and batch[LOSS_WEIGHTS] == [[0, 1], [], [], [1]]
    assert "tokens" not in batch and set(shift({"tokens": tf.constant([1, 2])})) == {"inputs", "targets"}
    folded = [[2 * t + w for t, w in zip(row_t, row_w)] for row_t, row_w in zip(tokens, weights)]
    inside = lm_shift(key="weighted_tokens")
    same = apart(inside({"weighted_tokens": tf.ragged.constant(folded, tf.int64)}))
    assert same["inputs"].to_list() == [[5, 6], [], [], [1]]
    assert same["targets"] == batch["targets"] and same[LOSS_WEIGHTS] == batch[LOSS_WEIGHTS]
    alone = apart(inside({"weighted_tokens": tf.constant(folded[0], tf.int64)}))
    assert alone["inputs"].numpy().tolist() == [5, 6] and alone["targets"] == [6, 7] and alone[LOSS_WEIGHTS] == [0, 1]
    with pytest.raises(ConfigError, match="holds its weights already"):
        lm_shift(key="weighted_tokens", default_weight=1)


def test_lm_shift_refuses_weights_that_are_not_one_per_token_naming_both():
    shift = tf.function(lm_shift())
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'loss_weights' must hold one weight per token "
                                                              "of 'tokens'"):
        shift({"tokens": tf.constant([5, 6, 7, 8]), LOSS_WEIGHTS: tf.constant([0, 1, 1])})
    with pytest.raises(tf.errors.InvalidArgumentError, match="one weight per token"):
        shift({"tokens": tf.ragged.constant([[5, 6], [7]]), LOSS_WEIGHTS: tf.ragged.constant([[1], [0, 1]])})


def lm_data(files: str, mode: str, overflow: str = "auto") -> dict:
    return {"source": {"type": "tfrecord", "files": files},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}, LOSS_WEIGHTS: {"dtype": "int64", "kind": "ragged"}},
            "preprocess": [{"op": "lm_shift", "key": "tokens"}],
            "sequence": {"keys": ["inputs", "targets", LOSS_WEIGHTS], "length": LENGTH, "mode": mode,
                         "overflow": overflow, "window": 16},
            "shuffle": {"buffer_size": 32}, "repeat": 1, "batch_size": 4, "seed": 3,
            **({} if mode == "bucket" else {"drop_remainder": False})}  # bucket: its last batches filled instead


def lm_config(files: str, mode: str, overflow: str = "auto", outputs: dict | None = None):
    data = {**lm_data(files, mode, overflow), **({"outputs": outputs} if outputs else {})}
    return config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_the_derived_outputs_weigh_by_the_loss_weights_which_are_no_input(files, mode):
    outputs = lm_config(files, mode).data.outputs
    mask = "_segment_ids" if mode == "pack" else "_mask"
    assert outputs.targets == "targets" and LOSS_WEIGHTS not in outputs.inputs and "inputs" in outputs.inputs
    expected = [*(["example_mask"] if mode == "bucket" else []), "targets" + mask, LOSS_WEIGHTS]
    assert outputs.weights == expected


@pytest.mark.parametrize("mode, overflow", [("pack", "split"), ("pack", "truncate"), ("pad", "truncate"),
                                            ("bucket", "truncate")])
def test_pack_pad_and_bucket_carry_each_targets_weight_row_for_row(files, mode, overflow):
    """Every real target's weight is its own token's; padding weighs 0; split packing trains on every answer
    token of every document once, truncation on those of each document's head."""
    # bucket: its filler examples (a bucket's last batches, example_mask 0) are no real targets: shown as an input
    outputs = {"inputs": ["inputs", "inputs_mask", "example_mask"], "targets": "targets",
               "weights": ["example_mask", "targets_mask", LOSS_WEIGHTS]} if mode == "bucket" else None
    pipeline = Pipeline.from_config(lm_config(files, mode, overflow, outputs).data)
    weighted, real_slots = 0, 0
    for inputs, targets, weights in pipeline.build():
        targets, weights = targets.numpy(), weights.numpy()
        real = (inputs["inputs_segment_ids"] if mode == "pack" else inputs["inputs_mask"]).numpy() > 0
        if mode == "bucket":
            real &= inputs["example_mask"].numpy()[:, None] > 0
        assert np.array_equal(weights[~real], np.zeros_like(weights[~real])), "padding weighs 0"
        assert np.array_equal(weights[real], (targets[real] % 2).astype(weights.dtype)), \
            "a target's weight is not its own token's"
        weighted += int(weights.sum())
        real_slots += int(real.sum())
    kept = [tokens[1:] if overflow == "split" else tokens[1:LENGTH + 1] for tokens in documents()]
    assert weighted == sum(weight_of(t) for targets in kept for t in targets)  # none lost, none twice
    assert 0 < weighted < real_slots  # some targets trained on, some not


@pytest.fixture(scope="module")
def coin_files(tmp_path_factory) -> str:
    """The documents with weights drawn apart from the tokens (the parity files would hide a weight read off its
    token's bits)."""
    root = tmp_path_factory.mktemp("coin_weights")
    rng = np.random.default_rng(8)

    def example(tokens: list[int]) -> bytes:
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   LOSS_WEIGHTS: tf.train.Feature(int64_list=tf.train.Int64List(value=rng.integers(0, 2, len(tokens))))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split((example(tokens) for tokens in documents()), str(root), "train", 3)
    return str(root / "train-*.tfrecord")


def packed_batches(files: str) -> list:
    data = {**lm_data(files, "pack", "split"), "sequence": {**lm_data(files, "pack", "split")["sequence"],
                                                            "row_shuffle": 2}}
    config = config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})
    return [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in Pipeline.from_config(config.data).build()]


def test_packed_weights_ride_in_their_targets_and_give_the_rows_packing_them_apart_gives(coin_files, monkeypatch):
    """Pack carries each weight inside its target's int64 (one key less to chunk and write): the batches are
    those of the weights packed as a key of their own, array for array, in the same order."""
    from tpu_pipeline.pipeline.sequences import carried_weights

    folded = []
    fold = carried_weights.fold
    monkeypatch.setattr(carried_weights, "fold", lambda features, pair: folded.append(pair) or fold(features, pair))
    carried = packed_batches(coin_files)
    assert folded == [(LOSS_WEIGHTS, "targets")]
    monkeypatch.setattr(carried_weights, "carried_pair", lambda *_: None)  # the weights packed apart, as before
    apart = packed_batches(coin_files)
    assert len(carried) == len(apart) > 4
    for got, expected in zip(carried, apart):
        tf.nest.assert_same_structure(got, expected)
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
            assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.fixture(scope="module")
def inside_files(tmp_path_factory) -> str:
    """coin_files' records as `convert --from chat` writes them: one list, `weighted_tokens`, each 2 * id + weight."""
    root = tmp_path_factory.mktemp("inside_weights")
    rng = np.random.default_rng(8)  # coin_files' weights, drawn in the same order

    def example(tokens: list[int]) -> bytes:
        values = [2 * token + int(weight) for token, weight in zip(tokens, rng.integers(0, 2, len(tokens)))]
        feature = {WEIGHTED_TOKENS: tf.train.Feature(int64_list=tf.train.Int64List(value=values))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    write_split((example(tokens) for tokens in documents()), str(root), "train", 3)
    return str(root / "train-*.tfrecord")


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_weights_inside_the_tokens_give_the_batches_of_weights_beside_them(coin_files, inside_files, mode):
    """`lm_shift key: weighted_tokens` reads each token as 2 * id + weight: pack (rows shuffled), pad and bucket
    deliver the batches the two-key form of the same records gives, array for array, in the same order."""
    def batches(files: str, inside: bool) -> list:
        data = lm_data(files, mode, "split" if mode == "pack" else "truncate")
        if mode == "pack":
            data["sequence"] = {**data["sequence"], "row_shuffle": 2}
        if inside:
            data["features"] = {WEIGHTED_TOKENS: {"dtype": "int64", "kind": "ragged"}}
            data["preprocess"] = [{"op": "lm_shift", "key": WEIGHTED_TOKENS}]
        config = config_from_dict({"data": data, "train": {"task": "language_model"},
                                   "model": {"architecture": "transformer"}})
        return [tf.nest.map_structure(lambda t: t.numpy(), batch) for batch in Pipeline.from_config(config.data).build()]

    inside, beside = batches(inside_files, True), batches(coin_files, False)
    assert len(inside) == len(beside) > 4
    for got, expected in zip(inside, beside):
        tf.nest.assert_same_structure(got, expected)
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    weights = np.concatenate([batch[2].ravel() for batch in inside])
    assert 0 < weights.sum() < weights.size  # some targets trained on, some not


def test_weights_packed_in_one_call_warn_of_nothing(files):
    """With data.num_parallel_calls 1 (the doctor tries it) the map that folds the weights is sequential: building it
    prints no TensorFlow warning on the user's terminal."""
    import warnings

    data = {**lm_data(files, "pack", "split"), "num_parallel_calls": 1}
    config = config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Pipeline.from_config(config.data).build()
    assert not [str(w.message) for w in caught if "deterministic" in str(w.message)]


def test_a_carried_weight_comes_back_exactly_and_one_other_than_0_or_1_is_refused_naming_it():
    from tpu_pipeline.pipeline.sequences.carried_weights import fold, unfold

    pair = (LOSS_WEIGHTS, "targets")
    ids = [-(1 << 40), -3, -1, 0, 1, 2, (1 << 31) - 1, 1 << 40]
    tokens = tf.ragged.constant([ids, [], ids[::-1]], tf.int64)
    weights = tf.ragged.constant([[i % 2 for i in ids], [], [1 - i % 2 for i in ids[::-1]]], tf.int64)
    spec = {"targets": tf.RaggedTensorSpec([None, None], tf.int64), LOSS_WEIGHTS: tf.RaggedTensorSpec([None, None], tf.int64)}
    carried = fold({"targets": tokens, LOSS_WEIGHTS: weights, "inputs": tokens}, pair)
    assert sorted(carried) == ["inputs", "targets"]
    back = unfold({"targets": carried["targets"].flat_values}, pair, spec)
    assert back["targets"].numpy().tolist() == tokens.flat_values.numpy().tolist()
    assert back[LOSS_WEIGHTS].numpy().tolist() == weights.flat_values.numpy().tolist()
    for weight in (2, -1):
        with pytest.raises(tf.errors.InvalidArgumentError, match="feature 'loss_weights' holds a weight other than 0 or 1"):
            fold({"targets": tf.constant([5, 6], tf.int64), LOSS_WEIGHTS: tf.constant([1, weight], tf.int64)}, pair)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'loss_weights' must hold one weight per token of 'targets'"):
        fold({"targets": tokens, LOSS_WEIGHTS: tf.ragged.constant([[1], [], [0]], tf.int64)}, pair)


def test_the_language_models_figures_count_the_weighted_tokens_only():
    """The loss and every metric over weighted targets only: numpy's figures and plain Keras's cross-entropy
    times the mask over the mask's sum; targets changed where they weigh 0 change no figure."""
    model = _compiled_language_model()
    inputs, real = _packed_batch(seed=3)
    logits = np.asarray(model(inputs, training=False))
    rng = np.random.default_rng(4)
    targets = rng.integers(3, 259, size=real.shape).astype(np.int32)
    answer = (rng.random(real.shape) < 0.4).astype(np.float32)  # the weighted tokens: 0.4 of the real ones
    weights = real * answer
    assert 0 < weights.sum() < real.sum()
    expected = _figures(logits, targets, weights)
    keras = tf.keras
    nats = keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True).numpy()
    plain = float((nats * weights).sum() / weights.sum())
    assert expected["cross_entropy"] == pytest.approx(plain, rel=1e-5)

    def evaluated(targets: np.ndarray) -> dict[str, float]:
        return model.evaluate(tf.data.Dataset.from_tensors((inputs, targets, weights)), verbose=0, return_dict=True)

    got = evaluated(targets)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5), name
    assert math.exp(got["cross_entropy"]) == pytest.approx(got["perplexity"], rel=1e-5)
    changed = targets.copy()
    unweighted = weights == 0
    changed[unweighted] = logits.argmax(axis=-1)[unweighted]  # where they weigh 0: now the prediction itself ...
    same = unweighted & (changed == targets)
    changed[same] = (targets[same] - 2) % 256 + 3  # ... or, where it was already, another byte
    assert (changed != targets)[unweighted].all()
    again = evaluated(changed)
    for name in expected:
        assert again[name] == pytest.approx(got[name], rel=1e-6), name


def test_a_record_whose_weights_are_not_one_per_token_is_named_with_its_file_and_the_fix(tmp_path):
    from tpu_pipeline.errors import DataError

    def example(tokens: list[int], weights: list[int]) -> bytes:
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   LOSS_WEIGHTS: tf.train.Feature(int64_list=tf.train.Int64List(value=weights))}
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    records = [example([5, 6, 7], [0, 1, 1])] * 9 + [example([5, 6, 7, 8], [0, 1, 1])] + [example([9, 9], [1, 1])] * 6
    write_split(iter(records), str(tmp_path), "train", 1)
    data = lm_data(str(tmp_path / "train-*.tfrecord"), "pad")
    data["shuffle"] = {"enabled": False}
    pipeline = Pipeline.from_config(config_from_dict({"data": data, "train": {"task": "language_model"},
                                                      "model": {"architecture": "transformer"}}).data)
    with pytest.raises(DataError) as raised:
        for _ in pipeline.iterator():
            pass
    line = str(raised.value)
    assert "\n" not in line and "train-" in line and "record 9" in line, line
    assert "feature 'loss_weights' must hold one weight per token of 'tokens'" in line, line


def test_train_on_weighted_tokens_trains_and_evaluates_on_them(files, tmp_path):
    """`train` end to end: the model takes the derived outputs (loss_weights no input of it), and its figures
    and the evaluation's are those of the weighted targets (finite, perplexity the exp of the loss)."""
    from tpu_pipeline.train import train

    data = {**lm_data(files, "pack", "split"), "repeat": "forever", "batch_size": 8}
    evaluation = {**lm_data(files, "pack", "split"), "shuffle": {"enabled": False}, "batch_size": 8}
    config = config_from_dict({
        "data": data, "eval_data": evaluation, "cluster": {"cpu_replicas": 8},
        "model": {"architecture": "transformer", "transformer": {"width": 16, "depth": 1, "heads": 2, "mlp_dim": 32},
                  "optimizer": {"name": "adam"}, "schedule": {"name": "constant", "learning_rate": 0.003}},
        "train": {"task": "language_model", "run_dir": str(tmp_path / "run"), "epochs": 1, "steps_per_epoch": 3,
                  "tensorboard": False, "num_classes": 259}})
    metrics = train(config, printer=lambda line: None)
    assert all(math.isfinite(metrics[key]) for key in ("loss", "token_accuracy", "eval_loss", "eval_perplexity"))
    assert metrics["eval_perplexity"] == pytest.approx(math.exp(metrics["eval_loss"]), rel=1e-4)


def test_lm_shift_gives_examples_without_weights_its_default_weight_and_refuses_another():
    shift = lm_shift(default_weight=1)
    one = apart(shift({"tokens": tf.constant([5, 6, 7])}))
    assert one[LOSS_WEIGHTS] == [1, 1] and one["targets"] == [6, 7]
    assert shift({"tokens": tf.constant([5, 6], tf.int32)})["weighted_targets"].dtype == tf.int32  # the tokens'
    assert shift({"tokens": tf.constant([5, 6], tf.int64)})["weighted_targets"].dtype == tf.int64
    batch = apart(shift({"tokens": tf.ragged.constant([[5, 6, 7], [], [1, 2]])}))
    assert batch[LOSS_WEIGHTS] == [[1, 1], [], [1]]
    kept = apart(shift({"tokens": tf.constant([5, 6, 7]), LOSS_WEIGHTS: tf.constant([1, 0, 0])}))
    assert kept[LOSS_WEIGHTS] == [0, 0]  # an example's own weights win

    for wrong in (2, 0.5, True):
        with pytest.raises(ConfigError, match="default_weight must be 0 or 1"):
            lm_shift(default_weight=wrong)


def test_plain_text_mixed_with_weighted_data_trains_on_all_its_tokens_and_the_answers_of_the_rest(files, tmp_path):
    """SFT plus a little pretraining text: a mixture of the weighted records (tokens 3-249, weight = parity) and
    plain text (tokens 250-299, no weights; `default_weight: 1` in its own preprocess): every real target of a
    plain document weighs 1, every other its own token's parity."""
    rng = np.random.default_rng(8)
    plain = (tf.train.Example(features=tf.train.Features(feature={"tokens": tf.train.Feature(
        int64_list=tf.train.Int64List(value=rng.integers(250, 300, size=int(n)).tolist()))})).SerializeToString()
        for n in rng.integers(2, 40, size=60))
    write_split(plain, str(tmp_path), "train", 2)
    data = lm_data(files, "pack", "split")
    data.pop("source")
    data["preprocess"] = []
    data["mixture"] = {"sources": [
        {"name": "answers", "weight": 0.7, "exhausted": "drop", "source": {"files": files},
         "preprocess": [{"op": "lm_shift", "key": "tokens"}]},
        {"name": "text", "weight": 0.3, "exhausted": "drop", "source": {"files": str(tmp_path / "train-*.tfrecord")},
         "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
         "preprocess": [{"op": "lm_shift", "key": "tokens", "default_weight": 1}]}]}
    config = config_from_dict({"data": data, "train": {"task": "language_model"}, "model": {"architecture": "transformer"}})
    from_text = from_answers = 0
    for inputs, targets, weights in Pipeline.from_config(config.data).build():
        targets, weights = targets.numpy(), weights.numpy()
        real = inputs["inputs_segment_ids"].numpy() > 0
        text = real & (targets >= 250)
        answers = real & (targets < 250)
        assert (weights[text] == 1).all() and np.array_equal(weights[answers], (targets[answers] % 2).astype(weights.dtype))
        assert (weights[~real] == 0).all()
        from_text, from_answers = from_text + int(text.sum()), from_answers + int(answers.sum())
    assert from_text and from_answers


def test_weights_read_in_the_other_form_than_stored_are_refused_with_the_config_that_reads_them(coin_files,
                                                                                                 inside_files):
    """A config for `weighted_tokens` on records with `tokens` + `loss_weights` (a chat set converted before), or
    the other way round: one line naming the feature, the form the records hold, and the features and op to read
    them with (not "set default: []", which would train on empty documents)."""
    from tpu_pipeline.errors import ConfigError

    inside = {**lm_data(coin_files, "pack"), "features": {WEIGHTED_TOKENS: {"dtype": "int64", "kind": "ragged"}},
              "preprocess": [{"op": "lm_shift", "key": WEIGHTED_TOKENS}]}
    for data, said in ((inside, "hold their loss weights beside the tokens ('tokens' and 'loss_weights'"),
                       (lm_data(inside_files, "pack"), "hold each token's loss weight inside it ('weighted_tokens'")):
        config = config_from_dict({"data": data, "train": {"task": "language_model"},
                                   "model": {"architecture": "transformer"}})
        with pytest.raises(ConfigError) as raised:
            Pipeline.from_config(config.data).build()
        line = str(raised.value)
        assert "\n" not in line and said in line and "default: []" not in line, line

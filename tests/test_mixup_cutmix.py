"""`mixup_cutmix`: mixup's λ follows Beta(α, α) (a Kolmogorov-Smirnov test on 10,000 draws), CutMix pastes 1 - λ of
the pixels exactly and weighs the labels by the area actually pasted, the targets sum to 1, and the op never
reaches an evaluation. In a pipeline it runs on each per-replica batch, seeded per batch, so a resumed pipeline
mixes as an uninterrupted one."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import check_ops, get_op
from tpu_pipeline.pipeline import Pipeline

from augment_reference import tfm_augment
from helpers import data_config, write_jpeg_shards

pytestmark = pytest.mark.tf_builds

BATCH = 1000  # even: example i's partner (the reversed batch's) is B - 1 - i, of the other parity


def mixed(seed: int, images: tf.Tensor, **arguments) -> tuple[np.ndarray, np.ndarray]:
    """The op on one batch whose labels alternate 0, 1 (so each example's partner has the other class)."""
    op = get_op("mixup_cutmix").build({"num_classes": 2, "label_smoothing": 0.0, **arguments})
    labels = tf.range(images.shape[0]) % 2
    out = op({"image": images, "label": labels}, tf.constant([11, seed], tf.int64))
    return out["image"].numpy(), out["label"].numpy()


def own_weight(targets: np.ndarray) -> np.ndarray:
    """λ of each example: the weight of its own class (label i % 2) in its targets."""
    return targets[np.arange(len(targets)), np.arange(len(targets)) % 2]


def test_mixup_lambda_follows_beta_alpha_alpha_on_10000_draws():
    images = tf.zeros([BATCH, 2, 2, 1])
    draws = np.concatenate([own_weight(mixed(seed, images, cutmix_alpha=0.0, mixup_alpha=0.8)[1]) for seed in range(10)])
    assert len(draws) == 10_000
    fit = stats.kstest(draws, stats.beta(0.8, 0.8).cdf)
    assert fit.pvalue > 1e-3, fit
    # The test is sharp enough for the bug tensorflow/models had until #13525: Gamma(α) / (Gamma(α) + Gamma(1)).
    rng = np.random.default_rng(0)
    first, second = rng.gamma(0.8, size=10_000), rng.gamma(1.0, size=10_000)
    assert stats.kstest(first / (first + second), stats.beta(0.8, 0.8).cdf).pvalue < 1e-6


def test_mixup_blends_each_image_with_its_partner_by_its_lambda():
    values = tf.reshape(tf.range(8, dtype=tf.float32), [8, 1, 1, 1]) * tf.ones([8, 3, 3, 2])
    images, targets = mixed(3, values, cutmix_alpha=0.0)
    lam = own_weight(targets)
    expected = lam * np.arange(8) + (1 - lam) * np.arange(8)[::-1]
    assert np.allclose(images[:, 0, 0, 0], expected, atol=1e-5) and np.allclose(images, images[:, :1, :1, :1])


@pytest.mark.parametrize("height, width", [(24, 40), (32, 32)])
def test_cutmix_pastes_one_minus_lambda_of_the_pixels_and_the_labels_weigh_what_was_pasted(height, width):
    """Each example i is filled with the value i + 1; the pixels of its partner's value are what was pasted.
    Also where the box is cut at the image's border (many of 1,000 are), the label weight is that share."""
    values = tf.reshape(tf.range(1, BATCH + 1, dtype=tf.float32), [BATCH, 1, 1, 1]) * tf.ones([BATCH, height, width, 3])
    images, targets = mixed(5, values, mixup_alpha=0.0, cutmix_alpha=1.0)
    partner = np.arange(BATCH, 0, -1, dtype=np.float32)
    pasted = (images[..., 0] == partner[:, None, None]).sum(axis=(1, 2)) / (height * width)
    assert np.allclose(1 - own_weight(targets), pasted, atol=1e-6)
    own = (images[..., 0] == np.arange(1, BATCH + 1)[:, None, None]).sum(axis=(1, 2)) / (height * width)
    assert np.allclose(own + pasted, 1.0)
    # Boxes that lie wholly inside keep the image's aspect (tensorflow/models takes both sides from the height).
    inside = np.array([_box(images[i, ..., 0] == partner[i]) for i in range(BATCH)], dtype=object)
    shapes = [(bottom - top, right - left) for box in inside if box is not None
              for top, bottom, left, right in [box] if top > 0 and left > 0 and bottom < height and right < width]
    assert len(shapes) > 50
    assert np.median([w / h for h, w in shapes if h >= 8]) == pytest.approx(width / height, rel=0.15)


def _box(mask: np.ndarray):
    rows, columns = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return None
    assert mask[rows[0]:rows[-1] + 1, columns[0]:columns[-1] + 1].all(), "the pasted pixels are one rectangle"
    return rows[0], rows[-1] + 1, columns[0], columns[-1] + 1


def test_targets_are_smoothed_mixed_and_sum_to_one():
    op = get_op("mixup_cutmix").build({"num_classes": 10, "label_smoothing": 0.1, "prob": 0.5})
    labels = tf.constant([3, 1, 4, 1, 5, 9, 2, 6])
    kinds = set()
    for seed in range(12):
        targets = op({"image": tf.random.stateless_uniform([8, 6, 6, 3], [0, seed]), "label": labels},
                     tf.constant([2, seed], tf.int64))["label"].numpy()
        assert targets.shape == (8, 10) and targets.dtype == np.float32
        assert np.allclose(targets.sum(axis=1), 1.0, atol=1e-6) and (targets >= 0).all()
        smoothed_only = np.allclose(targets[np.arange(8), labels.numpy()], 1 - 0.1 + 0.01)
        kinds.add(smoothed_only)
    assert kinds == {True, False}, "prob 0.5: some batches are mixed, some only smoothed"


def test_the_reference_implementations_targets_also_sum_to_one():
    """tensorflow/models' MixupAndCutmix on the same kind of batch: the property holds there too (our targets are
    not a different convention)."""
    tfm = tfm_augment().MixupAndCutmix(num_classes=10, label_smoothing=0.1)
    _, targets = tfm(tf.random.uniform([8, 6, 6, 3]), tf.constant([3, 1, 4, 1, 5, 9, 2, 6]))
    assert np.allclose(targets.numpy().sum(axis=1), 1.0, atol=1e-6)


def test_never_in_evaluation_nor_before_the_batch():
    mix = {"op": "mixup_cutmix", "num_classes": 4}
    with pytest.raises(ConfigError, match=r"eval_data\.augment\[0\].*evaluation must never"):
        check_ops(config_from_dict({"data": data_config("x-*"), "eval_data": data_config("y-*", augment=[mix])}).eval_data,
                  "eval_data")
    with pytest.raises(ConfigError, match=r"data\.preprocess\[5\].*whole batches; move it to the end of data\.augment"):
        check_ops(config_from_dict({"data": data_config("x-*", preprocess=data_config("x")["preprocess"] + [mix])}).data)
    with pytest.raises(ConfigError, match=r"data\.augment\[1\]: op 'random_flip' works on single examples but comes "
                                          r"after a batch-level op"):
        check_ops(config_from_dict({"data": data_config("x-*", augment=[mix, {"op": "random_flip"}])}).data)
    # An op that works on batches may follow: it runs on the mixed batch (a cast to bfloat16 after the mix is cheaper).
    check_ops(config_from_dict({"data": data_config("x-*", augment=[mix, {"op": "cast", "dtype": "bfloat16"}])}).data)


@pytest.fixture(scope="module")
def mixed_pipeline_config(tmp_path_factory) -> dict:
    files = write_jpeg_shards(tmp_path_factory.mktemp("mix"), 48, 2, size=20)
    return data_config(files, augment=[{"op": "cast", "key": "image", "dtype": "float32"},
                                       {"op": "mixup_cutmix", "num_classes": 4},
                                       {"op": "cast", "key": "image", "dtype": "bfloat16"}],
                       batch_size=8, repeat=2)


def test_a_pipeline_mixes_each_batch_and_a_resumed_one_mixes_as_the_uninterrupted(mixed_pipeline_config):
    config = config_from_dict({"data": mixed_pipeline_config}).data
    pipeline = Pipeline.from_config(config)
    batches = list(pipeline.build())
    assert len(batches) == 12 and batches[0]["label"].shape == (8, 4) and batches[0]["image"].dtype == tf.bfloat16
    assert all(np.allclose(batch["label"].numpy().sum(axis=1), 1.0, atol=1e-6) for batch in batches)
    resumed = list(pipeline.build(start=5 * 8))
    assert len(resumed) == 7
    for got, want in zip(resumed, batches[5:]):
        assert np.array_equal(got["image"].numpy(), want["image"].numpy())
        assert np.array_equal(got["label"].numpy(), want["label"].numpy())
    with pytest.raises(ConfigError, match=r"mixup_cutmix mixes examples and their labels, which an evaluation must never do"):
        pipeline.for_evaluation()

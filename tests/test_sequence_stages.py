"""PadTo and Bucket alone, on real datasets of variable-length token ids (0 is a real token)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.core.resume_position import split_position
from tpu_pipeline.pipeline.sequences.sequence_stages import Bucket, PadTo, bucket_batches
from tpu_pipeline.pipeline.stages.base import StageContext

pytestmark = pytest.mark.tf_builds


def token_dataset(lengths) -> tf.data.Dataset:
    """Example i: `lengths[i]` ids (i, i+1, ...) mod 50, so token 0 occurs at real positions."""
    examples = [{"tokens": (np.arange(n, dtype=np.int32) + i) % 50, "id": np.int32(i)} for i, n in enumerate(lengths)]
    return tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={"tokens": tf.TensorSpec([None], tf.int32), "id": tf.TensorSpec([], tf.int32)})


def expected_tokens(i: int, n: int) -> list[int]:
    return list((np.arange(n) + i) % 50)


def test_pad_to_pads_and_masks_and_keeps_token_zero():
    lengths = [3, 8, 0, 5]
    out = list(PadTo({"tokens": 8}).apply(token_dataset(lengths), StageContext()))
    for i, (example, n) in enumerate(zip(out, lengths)):
        assert example["tokens"].shape == [8]
        assert list(example["tokens_mask"].numpy()) == [1] * n + [0] * (8 - n)
        assert list(example["tokens"].numpy()[:n]) == expected_tokens(i, n)
    assert 0 in out[0]["tokens"].numpy()[:3]  # token 0 at a real position, mask 1


def test_pad_to_truncates_or_names_the_key_and_lengths():
    data = token_dataset([3, 12])
    cut = list(PadTo({"tokens": 8}, overflow="truncate").apply(data, StageContext()))
    assert list(cut[1]["tokens"].numpy()) == expected_tokens(1, 8) and cut[1]["tokens_mask"].numpy().sum() == 8
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"an example of tokens is longer than length 8; set data.sequence.overflow"):
        list(PadTo({"tokens": 8}).apply(data, StageContext()))


def bucket_outputs(lengths, context, **kwargs):
    stage = Bucket(keys=["tokens"], window=kwargs.pop("window", 16), lengths={"tokens": 32},
                   bucket_lengths=kwargs.pop("bucket_lengths", [8, 16, 32]), global_batch_size=kwargs.pop("batch", 8),
                   overflow=kwargs.pop("overflow", "error"), **kwargs)
    return [split_position({k: v.numpy() for k, v in out.items()}) for out in stage.apply(token_dataset(lengths), StageContext(context))]


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_bucket_delivers_every_example_once_and_groups_share_a_shape(replicas):
    rng = np.random.default_rng(replicas)
    lengths = rng.integers(0, 33, size=77)
    context = tf.distribute.InputContext(1, 0, replicas)
    outputs = bucket_outputs(lengths, context)
    seen = []
    for features, _ in outputs:
        for row, (example_id, real) in enumerate(zip(features["id"], features["example_mask"])):
            if real:
                n = lengths[example_id]
                assert list(features["tokens"][row][:n]) == expected_tokens(example_id, n)
                assert features["tokens_mask"][row].sum() == n
                seen.append(int(example_id))
            else:
                assert features["tokens_mask"][row].sum() == 0 and not features["tokens"][row].any()
    assert sorted(seen) == list(range(77))
    # Each step's replicas (consecutive groups of `replicas` outputs in a window) share one shape.
    assert len(outputs) % replicas == 0
    for start in range(0, len(outputs), replicas):
        shapes = {features["tokens"].shape for features, _ in outputs[start:start + replicas]}
        assert len(shapes) == 1, shapes


def test_bucket_shapes_are_the_bucket_lengths_and_positions_count_within_windows():
    outputs = bucket_outputs([1, 9, 17, 30, 2, 3, 4, 5], tf.distribute.InputContext(), window=4, batch=2)
    assert {features["tokens"].shape[1] for features, _ in outputs} == {8, 16, 32}
    windows = [int(meta["_example"]) // 4 for _, meta in outputs]  # a window starts at example window × 4
    assert windows == sorted(windows) and set(windows) == {0, 1}
    assert all(int(meta["_example"]) % 4 == 0 and int(meta["_chunk"]) == 0 for _, meta in outputs)
    for window in (0, 1):
        assert [int(m["_index"]) for _, m in outputs if int(m["_example"]) // 4 == window] == list(
            range(windows.count(window)))


def test_bucket_overflow_error_and_truncate():
    with pytest.raises(tf.errors.InvalidArgumentError, match="longer than length 32"):
        bucket_outputs([3, 40], tf.distribute.InputContext())
    outputs = bucket_outputs([3, 40], tf.distribute.InputContext(), overflow="truncate", batch=1)
    longest = [features for features, _ in outputs if features["tokens"].shape[1] == 32][0]
    assert longest["tokens_mask"].sum() == 32


def test_bucket_batch_by_tokens_scales_short_buckets_to_multiples_of_8():
    context = tf.distribute.InputContext(1, 0, 2)
    assert bucket_batches([128, 256, 512, 1024], 64, context, "tokens") == [256, 128, 64, 32]
    assert bucket_batches([128, 1024], 64, context, "examples") == [32, 32]
    assert bucket_batches([100, 1024], 16, context, "tokens") == [80, 8]


def test_a_missing_sequence_key_is_one_line():
    stage = Bucket(keys=["text"], window=4, lengths={"text": 8}, bucket_lengths=[8], global_batch_size=2)
    with pytest.raises(ConfigError, match=r"feature 'text' does not exist; features here: \['id', 'tokens'\]"):
        stage.apply(token_dataset([1]), StageContext())

"""data.sequence end to end (pad, bucket, pack) on real TFRecord files of variable-length int64 tokens.

Example i has LENGTHS[i] tokens (1 to over twice the row length); token j of it is i * 1000 + j, or 0
when j % 5 == 2: token 0 is a real token in nearly every example (example 0 starts with it), and
every other token names its example and place. So a packed row, which has no `id` feature, still
says which example (and which chunk of it, with overflow: split) each segment is, and every token
can be checked where it landed.

What is checked, each as the user builds it (`config_from_dict` → `Pipeline.from_config`):
- every example exactly once over 2 input pipelines x 8 replicas and through a real MirroredStrategy
  with 8 replicas; what drop_remainder leaves out, exactly;
- bucketing: every replica of a step gets one shape, and a bucket has one shape;
- a checkpointed iterator (`pipeline.iterator()`, `distributed_iterator`) restored into a fresh
  pipeline delivers exactly the rest, tensor for tensor;
- five SIGKILLs of a child iterating a packed pipeline (slow);
- the saved position is a few integers whatever the window and buffers;
- the TPU check on each mode's output.
"""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import TpuCompatibilityError
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.core.resume_position import POSITION_KEYS

from sequence_child import TOKEN_BASE, segment_ids, tokens_of

pytestmark = pytest.mark.tf_builds

NUM = 302  # 151 a pipeline of 2: odd, so a per-replica batch of 2 leaves one example over on each
LENGTH = 64
WINDOW = 32
GLOBAL_BATCH = 16  # 2 a replica over 8 replicas
REPLICAS = 8
PIPELINES = 2
PER_PIPELINE = REPLICAS // PIPELINES  # the replicas one input pipeline feeds per step

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CHILD = os.path.join(HERE, "sequence_child.py")


def make_lengths(num: int, seed: int = 0) -> list[int]:
    """Mostly 1..LENGTH, a fifth longer (up to 2.6 x LENGTH: 3 chunks with overflow split); the
    edges set: 1 token (example 0: the single token 0), exactly LENGTH, LENGTH + 1, 2 x LENGTH + 1."""
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(num) < 0.8, rng.integers(1, LENGTH + 1, num), rng.integers(LENGTH + 1, 169, num))
    lengths[:4] = [1, LENGTH, LENGTH + 1, 2 * LENGTH + 1]
    return [int(n) for n in lengths]


LENGTHS = make_lengths(NUM)


def write_token_files(directory, lengths: list[int], num_files: int = 4) -> str:
    """tf.Examples {tokens: int64 list, id: int64}, example i in file i % num_files; returns the glob."""
    os.makedirs(directory, exist_ok=True)
    writers = [tf.io.TFRecordWriter(os.path.join(directory, f"tokens-{f}.tfrecord")) for f in range(num_files)]
    for i, n in enumerate(lengths):
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens_of(i, n))),
                   "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
        writers[i % num_files].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for writer in writers:
        writer.close()
    return os.path.join(directory, "tokens-*.tfrecord")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_token_files(str(tmp_path_factory.mktemp("tokens")), LENGTHS)


def data_section(files: str, mode: str, overflow: str = "truncate", window: int = WINDOW, **overrides) -> dict:
    """The data section a user writes. Pack mode refuses every feature not packed, so it reads tokens only."""
    features = {"tokens": {"dtype": "int64", "kind": "ragged"}}
    if mode != "pack":
        features["id"] = {"dtype": "int64"}
    data = {"source": {"type": "tfrecord", "files": files}, "features": features,
            "sequence": {"keys": ["tokens"], "length": LENGTH, "mode": mode, "overflow": overflow, "window": window},
            "batch_size": GLOBAL_BATCH, "repeat": 1, "seed": 3}
    sequence = overrides.pop("sequence", {})
    data["sequence"].update(sequence)
    data.update(overrides)
    return data


def make_config(files: str, mode: str, **kwargs):
    return config_from_dict({"data": data_section(files, mode, **kwargs)}).data


def bucket_lengths(config) -> tuple[int, ...]:
    """The buckets the plan made (data.sequence.boundaries, or its defaults up to the length)."""
    return Pipeline.from_config(config).plan.sequence.value.bucket_lengths


def context(index: int, pipelines: int = PIPELINES, replicas: int = REPLICAS) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(pipelines, index, replicas)


def numpy_batches(dataset) -> list[dict[str, np.ndarray]]:
    return [{key: value.numpy() for key, value in batch.items()} for batch in dataset]


# --- reading the output back ------------------------------------------------------------------------------------

def padded_ids(batch: dict, bucket_lengths=None, lengths=LENGTHS) -> list[int]:
    """The ids of a pad or bucket batch's real examples, each row checked: its tokens are the
    example's head (token 0 included), the mask marks exactly them, padding is 0 with mask 0; a
    bucket row is as long as the shortest bucket that holds the (truncated) example."""
    tokens, mask, ids = batch["tokens"], batch["tokens_mask"], batch["id"]
    real = batch.get("example_mask", np.ones(len(ids), np.int32))
    width = tokens.shape[1]
    out = []
    for row in range(len(ids)):
        if not real[row]:  # a bucket's padding example: nothing in it
            assert not tokens[row].any() and not mask[row].any() and ids[row] == 0, f"padding row {row} is not empty"
            continue
        i = int(ids[row])
        n = min(lengths[i], LENGTH)
        assert n <= width, f"example {i} ({lengths[i]} tokens) is in a row of {width}"
        if bucket_lengths is not None:
            assert width == min(b for b in bucket_lengths if b >= n), f"example {i} of {n} tokens in bucket {width}"
        assert mask[row].tolist() == [1] * n + [0] * (width - n), f"example {i}: mask {mask[row].tolist()}"
        assert tokens[row].tolist() == tokens_of(i, n) + [0] * (width - n), \
            f"example {i}: tokens {tokens[row].tolist()}"
        out.append(i)
    return out


def packed_segments(batch: dict, lengths=LENGTHS) -> list[tuple[int, int, int]]:
    """(example, first token, tokens) of each segment of a packed batch, rows in order, each checked:
    segment ids 1..k in order then 0 padding; positions 0.. within a segment; padding tokens and
    positions 0; the segment's tokens exactly tokens [first, first + n) of its example."""
    out = []
    for tokens, segments, positions in zip(batch["tokens"], batch["tokens_segment_ids"], batch["tokens_positions"]):
        used = int((segments > 0).sum())
        assert (segments[:used] > 0).all() and not segments[used:].any(), f"padding inside a row: {segments.tolist()}"
        assert not tokens[used:].any() and not positions[used:].any(), "padding carries tokens or positions"
        assert (np.diff(segments[:used]) >= 0).all() and set(segments[:used].tolist()) == set(
            range(1, int(segments.max(initial=0)) + 1)), f"segments not 1..k in order: {segments.tolist()}"
        for segment in range(1, int(segments.max(initial=0)) + 1):
            where = segments == segment
            values, places = tokens[where], positions[where]
            assert places.tolist() == list(range(len(values))), f"positions {places.tolist()}"
            example, first = decode(values)
            assert values.tolist() == tokens_of(example, lengths[example])[first:first + len(values)], \
                f"segment {values.tolist()} is not tokens {first}.. of example {example}"
            out.append((example, first, len(values)))
    return out


def decode(values: np.ndarray) -> tuple[int, int]:
    """(example, first token) of a segment: any non-zero token i * 1000 + j at place q gives both."""
    nonzero = np.flatnonzero(values)
    if not len(nonzero):
        return 0, 0  # only example 0 has a chunk of zeros alone: its single token 0
    q = int(nonzero[0])
    example, place = divmod(int(values[q]), TOKEN_BASE)
    return example, place - q


def assert_every_token_once(segments: list[tuple[int, int, int]], split: bool, ids=range(NUM), lengths=LENGTHS):
    """Truncate: each example once, its head of up to LENGTH tokens. Split: each example's chunks
    cover all its tokens once, in chunks of LENGTH from its start (every chunk's content and
    positions were checked where it was read)."""
    chunks = collections.defaultdict(list)
    for example, first, n in segments:
        chunks[example].append((first, n))
    assert sorted(chunks) == sorted(ids), f"examples missing: {sorted(set(ids) - set(chunks))[:10]}, " \
                                          f"unknown: {sorted(set(chunks) - set(ids))[:10]}"
    for example, parts in chunks.items():
        n = lengths[example]
        if split:
            expected = [(start, min(LENGTH, n - start)) for start in range(0, n, LENGTH)]
        else:
            expected = [(0, min(n, LENGTH))]
        assert sorted(parts) == expected, f"example {example} ({n} tokens) came as {parts}, expected {expected}"


# --- 1. exactly once over 2 input pipelines x 8 replicas, and through a real MirroredStrategy --------------------

def test_pad_every_example_once_over_two_input_pipelines_but_each_pipelines_remainder(files):
    """drop_remainder (the default, for static TPU shapes) cuts each input pipeline's stream into per-replica
    batches of 2 and drops the last partial one: of each pipeline's 151 examples, exactly its last 1 (in
    its own order) is left out of the epoch, nothing else. With drop_remainder false, nothing is."""
    per_replica = GLOBAL_BATCH // REPLICAS
    kept = [numpy_batches(Pipeline.from_config(make_config(files, "pad")).build(context(i))) for i in range(PIPELINES)]
    every = [numpy_batches(Pipeline.from_config(make_config(files, "pad", drop_remainder=False)).build(context(i)))
             for i in range(PIPELINES)]
    kept_ids = [[i for batch in stream for i in padded_ids(batch)] for stream in kept]
    every_ids = [[i for batch in stream for i in padded_ids(batch)] for stream in every]
    share = NUM // PIPELINES
    assert sorted(every_ids[0] + every_ids[1]) == list(range(NUM))  # every example once over both pipelines
    for index in range(PIPELINES):
        assert len(every_ids[index]) == share
        assert all(batch["tokens"].shape == (per_replica, LENGTH) for batch in kept[index])
        assert kept_ids[index] == every_ids[index][:share - share % per_replica], \
            f"pipeline {index}: drop_remainder left out more (or other) examples than its last partial batch"
    assert len(set(kept_ids[0] + kept_ids[1])) == NUM - PIPELINES * (share % per_replica)


def test_bucket_every_example_once_over_two_input_pipelines_none_dropped(files):
    """Bucket mode fills each bucket's last group with padding examples (example_mask 0): drop_remainder drops
    nothing, and both pipelines deliver as many batches (whole steps of 4 replicas each)."""
    config = make_config(files, "bucket")
    pipeline = Pipeline.from_config(config)
    streams = [numpy_batches(pipeline.build(context(i))) for i in range(PIPELINES)]
    bounds = bucket_lengths(config)
    ids = [i for stream in streams for batch in stream for i in padded_ids(batch, bounds)]
    assert sorted(ids) == list(range(NUM)), collections.Counter(ids).most_common(3)
    assert len(streams[0]) == len(streams[1]) and len(streams[0]) % PER_PIPELINE == 0


@pytest.mark.parametrize("overflow", ["truncate", "split"])
def test_pack_every_token_once_over_two_input_pipelines_but_each_pipelines_last_rows(files, overflow):
    """Pack mode's batches are of rows: drop_remainder drops each pipeline's last rows (fewer than a per-replica
    batch of 2), and with them exactly the segments (examples, or chunks of them with split) they hold."""
    per_replica = GLOBAL_BATCH // REPLICAS
    split = overflow == "split"
    rows = {}
    for drop in (True, False):
        pipeline = Pipeline.from_config(make_config(files, "pack", overflow=overflow, drop_remainder=drop))
        rows[drop] = [numpy_batches(pipeline.build(context(i))) for i in range(PIPELINES)]
    every = [packed_segments(batch) for stream in rows[False] for batch in stream]
    assert_every_token_once([s for segments in every for s in segments], split)
    kept, lost = [], []
    for index in range(PIPELINES):
        all_rows = [{key: batch[key][r:r + 1] for key in batch} for batch in rows[False][index]
                    for r in range(len(batch["tokens"]))]
        cut = len(all_rows) - len(all_rows) % per_replica
        assert len(rows[True][index]) == cut // per_replica, f"pipeline {index}: not every whole batch of rows came"
        delivered = [s for batch in rows[True][index] for s in packed_segments(batch)]
        assert delivered == [s for row in all_rows[:cut] for s in packed_segments(row)], \
            f"pipeline {index}: with drop_remainder the rows differ from the whole stream's"
        kept += delivered
        lost += [s for row in all_rows[cut:] for s in packed_segments(row)]
    assert_every_token_once(kept + lost, split)
    if split:
        # Each chunk of a long example is a segment of its own (positions from 0), placed on its own: a
        # first_fit packer may even put a later chunk in an earlier row. What holds: every token once,
        # each chunk in order (checked where it was read), and the long examples really were split.
        assert any(n == LENGTH for _, first, n in kept if first == 0)
        assert any(first == 2 * LENGTH for _, first, _ in kept)


def steps_of(strategy, dataset) -> list[list[dict[str, np.ndarray]]]:
    """Each global step as its 8 replicas' batches."""
    return [[{key: value.numpy() for key, value in part.items()} for part in strategy.experimental_local_results(step)]
            for step in dataset]


@pytest.mark.parametrize("mode", ["pad", "bucket", "pack"])
def test_a_mirrored_strategy_with_8_replicas_delivers_every_example_once(files, eight_replica_strategy, mode):
    """One input pipeline feeds the 8 replicas in turn: step s, replica r gets the pipeline's batch 8s + r.
    tf.distribute ends at the last whole step (every batch here has a static size), so what is left out
    is exactly the pipeline's batches after the last whole step: pad: 151 batches of 2 = 18 steps, the
    last 7 batches (14 examples, as NUM % 16 says); bucket: none (its groups are whole steps); pack: the
    rows after the last whole step of 8 batches of 2 rows (and rows short of a batch of 2)."""
    strategy = eight_replica_strategy
    config = make_config(files, mode)
    pipeline = Pipeline.from_config(config)
    stream = numpy_batches(pipeline.build(context(0, 1, REPLICAS)))
    steps = steps_of(strategy, pipeline.distribute(strategy))
    whole = len(stream) // REPLICAS
    assert len(steps) == whole
    for s, step in enumerate(steps):
        assert len(step) == REPLICAS
        for r, part in enumerate(step):
            expected = stream[s * REPLICAS + r]
            assert part.keys() == expected.keys()
            for key in part:
                np.testing.assert_array_equal(part[key], expected[key], err_msg=f"step {s} replica {r} {key}")
        if mode == "bucket":
            assert len({part["tokens"].shape for part in step}) == 1, f"step {s}: replicas got different shapes"
    delivered = [batch for step in steps for batch in step]
    left = stream[len(delivered):]
    if mode == "pack":
        got = [s for batch in delivered for s in packed_segments(batch)]
        lost = [s for batch in left for s in packed_segments(batch)]
        assert_every_token_once(got + lost + dropped_rows(files, config), split=False)
    else:
        bounds = bucket_lengths(config) if mode == "bucket" else None
        got = [i for batch in delivered for i in padded_ids(batch, bounds)]
        lost = [i for batch in left for i in padded_ids(batch, bounds)]
        assert sorted(got + lost) == list(range(NUM)) and len(set(got)) == len(got)
        assert len(lost) == {"pad": NUM % GLOBAL_BATCH, "bucket": 0}[mode]


def dropped_rows(files: str, config) -> list[tuple[int, int, int]]:
    """The segments in the rows that a pack pipeline's batch (drop_remainder) leaves out at the end."""
    every = numpy_batches(Pipeline.from_config(config.model_copy(update={"drop_remainder": False})).build(
        context(0, 1, REPLICAS)))
    kept = len(numpy_batches(Pipeline.from_config(config).build(context(0, 1, REPLICAS))))
    return [s for batch in every[kept:] for s in packed_segments(batch)]


# --- 2. bucketing: one shape for every replica of a step, one shape per bucket ----------------------------------

@pytest.mark.parametrize("scale, batch_size", [("examples", GLOBAL_BATCH), ("tokens", 64)])
def test_bucketing_never_gives_two_replicas_of_a_step_different_shapes(files, scale, batch_size):
    """2 input pipelines x 8 replicas: each pipeline feeds 4 replicas a step, so step k is outputs
    [4k, 4k + 4) of each pipeline, and all 8 must have one shape; one pipeline x 8 replicas: outputs
    [8k, 8k + 8). And a bucket has one shape ([its batch, its length]) wherever it comes."""
    sequence = {"boundaries": [16, 32, 64], "bucket_batch": scale}
    config = make_config(files, "bucket", batch_size=batch_size, window=64, sequence=sequence)
    pipeline = Pipeline.from_config(config)
    bounds = bucket_lengths(config)
    shapes_per_bucket = collections.defaultdict(set)

    def shapes(batch: dict) -> tuple:
        shape = batch["tokens"].shape
        shapes_per_bucket[shape[1]].add(shape)
        assert batch["tokens_mask"].shape == shape and batch["example_mask"].shape == batch["id"].shape == shape[:1]
        return shape

    two = [numpy_batches(pipeline.build(context(i))) for i in range(PIPELINES)]
    assert len(two[0]) == len(two[1]), "the input pipelines disagree on the number of steps"
    assert len(two[0]) % PER_PIPELINE == 0
    for k in range(len(two[0]) // PER_PIPELINE):
        step = [shapes(batch) for stream in two for batch in stream[k * PER_PIPELINE:(k + 1) * PER_PIPELINE]]
        assert len(set(step)) == 1, f"step {k}: replicas got shapes {step}"
    assert sorted(i for stream in two for batch in stream for i in padded_ids(batch, bounds)) == list(range(NUM))

    one = numpy_batches(pipeline.build(context(0, 1, REPLICAS)))
    assert len(one) % REPLICAS == 0
    for k in range(len(one) // REPLICAS):
        step = [shapes(batch) for batch in one[k * REPLICAS:(k + 1) * REPLICAS]]
        assert len(set(step)) == 1, f"step {k}: replicas got shapes {step}"
    assert sorted(i for batch in one for i in padded_ids(batch, bounds)) == list(range(NUM))

    assert set(shapes_per_bucket) <= set(bounds)
    for length, seen in shapes_per_bucket.items():
        assert len(seen) == 1, f"bucket {length} came in shapes {seen}"
    if scale == "tokens":  # batch x length near constant: 8 x 64, 16 x 32, 32 x 16 a replica
        assert {length: next(iter(seen))[0] for length, seen in shapes_per_bucket.items()} == \
            {16: 32, 32: 16, 64: 8}


# --- 3. exact resume --------------------------------------------------------------------------------------------

RESUME_NUM = 200  # repeat 2: 400 examples, batches of 8, windows of 16


@pytest.fixture(scope="module")
def resume_files(tmp_path_factory) -> str:
    return write_token_files(str(tmp_path_factory.mktemp("resume_tokens")), LENGTHS[:RESUME_NUM], num_files=3)


def resume_config(files: str, mode: str, parse: str, overflow: str = "truncate"):
    # pack: rows shuffled in pools of 2 windows, so two epochs hold many pools to resume inside and between
    sequence = {"row_shuffle": 2} if mode == "pack" else {}
    return make_config(files, mode, overflow=overflow, window=16, batch_size=8, repeat=2, parse=parse,
                       shuffle={"buffer_size": 64}, sequence=sequence)


def positions_of(pipeline: Pipeline, ctx=None) -> list[tuple[tuple[tuple, int], tuple[tuple, int]]]:
    """((window, index) of the first output, of the last output) of each element; a window is named by
    the (example, chunk) where it starts."""
    out = []
    for _, position in pipeline.build(ctx, with_position=True):
        hi, lo, chunk, index = (np.reshape(position[key].numpy(), [-1]) for key in POSITION_KEYS)
        window = [(int(h) * 2**31 + int(l), int(c)) for h, l, c in zip(hi, lo, chunk)]
        out.append(((window[0], int(index[0])), (window[-1], int(index[-1]))))
    return out


def resume_points(positions, first_of_epoch_two: int) -> dict[str, int]:
    """Where to checkpoint: the start, mid window (the batch before ends inside the window the next
    one goes on with), a window boundary (the next batch starts a window), the epoch boundary (the
    batch that brings epoch 2's first example), one before the end, and the end."""
    mids = [k for k in range(1, len(positions)) if positions[k][0][0] == positions[k - 1][1][0]]
    bounds = [k for k in range(1, len(positions)) if positions[k][0][0] != positions[k - 1][1][0]]
    assert mids and bounds, (mids, bounds)
    points = {"start": 0, "mid_window": mids[len(mids) // 3], "window_boundary": bounds[len(bounds) // 2],
              "epoch_boundary": first_of_epoch_two, "before_end": len(positions) - 1, "end": len(positions)}
    # pack with overflow=split: a window that starts inside a document (its chunk > 0), resumed from
    inside = [k for k in range(1, len(positions)) if positions[k][1][0][1] > 0 and positions[k][1][0] == positions[k - 1][1][0]]
    if inside:
        points["window_starting_inside_a_document"] = inside[0]
    return points


def first_repeat(ids_per_batch: list[list[int]]) -> int:
    """The batch that holds some example the second time (epoch 2 has begun)."""
    seen = set()
    for k, ids in enumerate(ids_per_batch):
        if seen & set(ids) or len(set(ids)) < len(ids):
            return k
        seen |= set(ids)
    raise AssertionError("no example came twice: not two epochs")


def assert_same_batches(got: list[dict], expected: list[dict], what: str) -> None:
    assert len(got) == len(expected), f"{what}: {len(got)} batches, expected {len(expected)}"
    for index, (a, b) in enumerate(zip(got, expected)):
        assert a.keys() == b.keys(), f"{what}: batch {index} keys"
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}: batch {index}, {key}")


def saved_along_the_way(make_iterator, points: dict[str, int], directory, read) -> tuple[list, dict[int, str]]:
    """One uninterrupted pass of a fresh iterator, checkpointed (tf.train.Checkpoint(data=it)) after k
    elements for each k of `points`: (every element as `read` gives it, {k: checkpoint path})."""
    iterator = make_iterator()
    checkpoint = tf.train.Checkpoint(data=iterator)
    full, paths = [], {}
    wanted = set(points.values())
    while True:
        if len(full) in wanted:
            paths[len(full)] = checkpoint.write(str(directory / f"after-{len(full)}"))
        try:
            full.append(read(next(iterator)))
        except StopIteration:
            break
    assert set(paths) == wanted, (sorted(paths), points)
    return full, paths


def assert_restored_rests(make_iterator, points, paths, full, read) -> None:
    for name, k in points.items():
        restored = make_iterator()
        tf.train.Checkpoint(data=restored).read(paths[k]).assert_consumed()
        assert int(restored.position.numpy()) == k
        assert_same_batches([read(element) for element in restored], full[k:], f"restored at {name} (batch {k})")


@pytest.mark.parametrize("parse", ["batched", "per_example"])
@pytest.mark.parametrize("mode, overflow", [("pad", "truncate"), ("bucket", "truncate"), ("pack", "truncate"),
                                            ("pack", "split")])
def test_a_restored_iterator_delivers_exactly_the_rest(resume_files, tmp_path, mode, overflow, parse):
    config = resume_config(resume_files, mode, parse, overflow)
    pipeline = Pipeline.from_config(config)
    assert pipeline.plan.parse.value == parse
    lengths = LENGTHS[:RESUME_NUM]
    read = lambda batch: {key: value.numpy() for key, value in batch.items()}  # noqa: E731
    if mode == "pack":
        ids = lambda batch: [e for e, first, _ in packed_segments(batch, lengths) if first == 0]  # noqa: E731
        positions = positions_of(pipeline)
    elif mode == "bucket":
        bounds = pipeline.plan.sequence.value.bucket_lengths
        ids = lambda batch: padded_ids(batch, bounds, lengths)  # noqa: E731
        positions = positions_of(pipeline)
    else:  # pad is not windowed: batch k starts at example 8k, the epoch boundary is 200 / 8 = 25
        ids = lambda batch: padded_ids(batch, None, lengths)  # noqa: E731
        positions = None
    expected = numpy_batches(pipeline.build())
    first_of_epoch_two = first_repeat([ids(batch) for batch in expected])
    if positions is None:
        assert first_of_epoch_two == RESUME_NUM // 8
        points = {"start": 0, "mid_epoch": 7, "epoch_boundary": first_of_epoch_two,
                  "before_end": len(expected) - 1, "end": len(expected)}
    else:
        assert len(positions) == len(expected)
        points = resume_points(positions, first_of_epoch_two)
        if overflow == "split":  # long documents are cut before packing: some window starts inside one
            assert "window_starting_inside_a_document" in points, positions
    make = lambda: Pipeline.from_config(config).iterator()  # noqa: E731
    full, paths = saved_along_the_way(make, points, tmp_path, read)
    assert_same_batches(full, expected, "the iterator against the dataset")
    counts = collections.Counter(i for batch in full for i in ids(batch))
    assert set(counts) == set(range(RESUME_NUM)) and max(counts.values()) == 2  # two epochs
    if mode != "pack":  # pack: drop_remainder drops the last rows short of a batch, and their examples
        assert min(counts.values()) == 2
    assert_restored_rests(make, points, paths, full, read)


def test_a_restored_bucket_iterator_of_one_of_two_input_pipelines_delivers_exactly_the_rest(resume_files, tmp_path):
    """Bucketing over 2 pipelines reads the whole stream on each and keeps its own replicas' batches: a
    resume skips outputs of that whole stream, not of the pipeline's own share."""
    config = resume_config(resume_files, "bucket", "batched").model_copy(update={"batch_size": GLOBAL_BATCH})
    read = lambda batch: {key: value.numpy() for key, value in batch.items()}  # noqa: E731
    ctx = context(1)
    positions = positions_of(Pipeline.from_config(config), ctx)
    points = {"start": 0, **{name: k for name, k in resume_points(positions, 1).items()
                             if name in ("mid_window", "window_boundary", "end")}}
    make = lambda: Pipeline.from_config(config).iterator(ctx)  # noqa: E731
    full, paths = saved_along_the_way(make, points, tmp_path, read)
    assert_restored_rests(make, points, paths, full, read)


def test_a_restored_distributed_iterator_delivers_exactly_the_rest_with_pack(resume_files, tmp_path,
                                                                              eight_replica_strategy):
    strategy = eight_replica_strategy
    # One row a replica: a step of 8 rows ends where a window (~11 rows) does now and then.
    config = resume_config(resume_files, "pack", "batched").model_copy(update={"batch_size": REPLICAS})
    lengths = LENGTHS[:RESUME_NUM]

    def read(step) -> list[dict[str, np.ndarray]]:
        parts = strategy.experimental_local_results(step)
        return [{key: value.numpy() for key, value in part.items()} for part in parts]

    # Step s is the pipeline's elements [8s, 8s + 8): its position is the first's first and the last's last.
    per_batch = positions_of(Pipeline.from_config(config), context(0, 1, REPLICAS))
    positions = [(per_batch[s * REPLICAS][0], per_batch[s * REPLICAS + REPLICAS - 1][1])
                 for s in range(len(per_batch) // REPLICAS)]
    expected = [read(step) for step in Pipeline.from_config(config).distribute(strategy)]
    assert len(expected) == len(positions)
    heads = [[e for part in step for e, first, _ in packed_segments(part, lengths) if first == 0] for step in expected]
    points = resume_points(positions, first_repeat(heads))
    del points["before_end"]  # each restore builds a distributed dataset: a second or two
    make = lambda: Pipeline.from_config(config).distributed_iterator(strategy)  # noqa: E731
    full, paths = saved_along_the_way(make, points, tmp_path, read)

    def flat(steps) -> list[dict[str, np.ndarray]]:
        return [{f"{r}/{key}": value for r, part in enumerate(step) for key, value in part.items()} for step in steps]

    assert_same_batches(flat(full), flat(expected), "the distributed iterator against the distributed dataset")
    for name, k in points.items():
        restored = make()
        tf.train.Checkpoint(data=restored).read(paths[k]).assert_consumed()
        assert_same_batches(flat([read(step) for step in restored]), flat(full[k:]), f"restored at {name} (step {k})")


# --- 4. SIGKILLs of a child iterating a packed pipeline ---------------------------------------------------------

KILL_NUM = 256  # a multiple of the window and of the row pool: neither straddles the two epochs
KILL_POOL = {"row_shuffle": 4}  # pools of 4 windows (128 examples of one chunk each): rows shuffled within


def read_ids_log(path: str) -> list[tuple[int, list[int]]]:
    if not os.path.exists(path):
        return []
    lines = open(path).read().split("\n")[:-1]  # a line cut short by a kill has no newline
    return [(int(line.split()[0]), [int(i) for i in line.split()[1:]]) for line in lines]


def logged_step(path: str) -> int:
    return max((step for step, _ in read_ids_log(path)), default=-1)


@pytest.mark.slow
def test_five_sigkills_of_a_packed_pipeline_deliver_every_example_once_an_epoch(tmp_path):
    files = write_token_files(str(tmp_path / "data"), LENGTHS[:KILL_NUM])
    data = data_section(files, "pack", repeat=2, batch_size=8, drop_remainder=False, sequence=KILL_POOL)
    config_path, out_dir = str(tmp_path / "config.json"), str(tmp_path / "out")
    os.makedirs(out_dir)
    json.dump({"data": data}, open(config_path, "w"))
    log = os.path.join(out_dir, "ids.log")

    uninterrupted = [segment_ids(batch) for batch in numpy_batches(Pipeline.from_config(make_config(
        files, "pack", repeat=2, batch_size=8, drop_remainder=False, sequence=KILL_POOL)).build())]
    assert len(uninterrupted) > 30

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join([REPO, HERE])}
    command = [sys.executable, CHILD, config_path, out_dir]
    rng = random.Random(20)
    restored = 0
    for kill in range(5):
        target = logged_step(log) + rng.randint(1, 6)
        assert target < len(uninterrupted) - 1
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        deadline = time.monotonic() + 240
        while child.poll() is None and logged_step(log) < target:
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.03))  # anywhere in the step: between the ids line and the checkpoint too
        child.send_signal(signal.SIGKILL)
        output, _ = child.communicate(timeout=60)
        assert child.returncode == -signal.SIGKILL, f"kill {kill}: the child ended by itself:\n{output[-3000:]}"
        restored += "restored at step" in output
    assert restored >= 4, "too few kills came after a checkpoint"
    final = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0 and "done" in final.stdout, final.stdout[-2000:] + final.stderr[-3000:]

    lines = read_ids_log(log)
    assert [step for step, _ in lines] == list(range(len(uninterrupted))), "a step missing or logged twice"
    assert [ids for _, ids in lines] == uninterrupted, "the killed run delivered other batches than an unkilled one"
    # Steps the child delivered and logged but had not checkpointed when killed: redone with the same ids.
    redone = read_ids_log(os.path.join(out_dir, "redone.log"))
    assert all(ids == uninterrupted[step] for step, ids in redone), "a redone step saw other examples"
    stream = [i for _, ids in lines for i in ids]
    assert len(stream) == 2 * KILL_NUM
    for epoch in range(2):
        assert sorted(stream[epoch * KILL_NUM:(epoch + 1) * KILL_NUM]) == list(range(KILL_NUM)), f"epoch {epoch}"


# --- 5. the saved state with a large window ---------------------------------------------------------------------

def checkpoint_of(iterator, batches: int, prefix: str) -> tuple[dict[str, tuple], int]:
    """Checkpoints `iterator` after `batches`: ({variable: (shape, dtype)}, bytes of its data file)."""
    for _ in range(batches):
        next(iterator)
    path = tf.train.Checkpoint(data=iterator).write(prefix)
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    variables = {name: (tuple(shape), dtypes[name]) for name, shape in reader.get_variable_to_shape_map().items()
                 if name != "_CHECKPOINTABLE_OBJECT_GRAPH"}
    data_bytes = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(path + ".data-*"))
    return variables, data_bytes


@pytest.mark.parametrize("parse", ["batched", "per_example"])  # a window shuffle, or a buffer of 100k records
def test_a_pack_iterator_with_a_65536_window_saves_a_few_integers(files, tmp_path, parse):
    big = make_config(files, "pack", window=65536, batch_size=4, shuffle={"buffer_size": 100_000}, parse=parse)
    pipeline = Pipeline.from_config(big)
    variables, data_bytes = checkpoint_of(pipeline.iterator(), 3, str(tmp_path / "pack"))
    assert len(variables) <= 5, variables
    assert all(shape == () and dtype == tf.int64 for shape, dtype in variables.values()), variables
    assert {name.split("/")[1] for name in variables} <= {"position", "examples_per_batch", "example", "chunk",
                                                          "in_window"}

    # The baseline: a pipeline that is not windowed (pad), whose iterator saves position and batch size.
    plain = make_config(files, "pad", batch_size=4, shuffle={"buffer_size": 100_000}, parse=parse)
    base_variables, base_bytes = checkpoint_of(Pipeline.from_config(plain).iterator(), 3, str(tmp_path / "pad"))
    assert len(base_variables) == 2
    assert data_bytes < base_bytes + 1024, f"the pack iterator saves {data_bytes} bytes, a plain one {base_bytes}"

    # The measure sees buffered state: tf.data's own iterator of the same pipeline saves its window and buffers.
    theirs = iter(pipeline.build())
    for _ in range(3):
        next(theirs)
    path = tf.train.Checkpoint(data=theirs).write(str(tmp_path / "tfdata"))
    their_bytes = sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(path + ".data-*"))
    assert their_bytes > base_bytes + 1024, their_bytes


# --- 6. the TPU check -------------------------------------------------------------------------------------------

CAST_ID = [{"op": "cast", "key": "id", "dtype": "int32"}]  # TPUs take no int64: the id, where kept, is cast


@pytest.mark.parametrize("parse", ["batched", "per_example"])
@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_pad_and_pack_pass_the_tpu_check_static_and_int32(files, mode, parse):
    ops = [] if mode == "pack" else CAST_ID
    dataset = Pipeline.from_config(make_config(files, mode, parse=parse, preprocess=ops), target="tpu").build()
    for name, spec in dataset.element_spec.items():
        assert spec.shape.is_fully_defined() and spec.dtype == tf.int32, (name, spec)
        assert spec.shape[0] == GLOBAL_BATCH


@pytest.mark.parametrize("parse", ["batched", "per_example"])
def test_bucket_output_passes_the_tpu_check_one_compile_per_bucket(files, parse):
    """Bucket mode's row length varies by design (one static shape, one XLA compile, per bucket), so the
    length dimension may be None in the element spec; every other dimension is static."""
    config = make_config(files, "bucket", parse=parse, preprocess=CAST_ID)
    spec = Pipeline.from_config(config).build().element_spec
    assert spec["tokens"].shape.as_list() == [GLOBAL_BATCH, None]
    assert spec["tokens_mask"].shape.as_list() == [GLOBAL_BATCH, None], spec  # the batch is static in every feature
    assert spec["example_mask"].shape.as_list() == spec["id"].shape.as_list() == [GLOBAL_BATCH], spec
    Pipeline.from_config(config, target="tpu").build()


def test_a_ragged_feature_without_data_sequence_is_refused_for_tpu_naming_data_sequence(files):
    data = data_section(files, "pad", preprocess=CAST_ID)
    del data["sequence"]
    pipeline = Pipeline.from_config(config_from_dict({"data": data}).data, target="tpu")
    with pytest.raises(TpuCompatibilityError) as error:
        pipeline.build()
    problems = str(error.value).splitlines()[1:]  # a header, then one line per feature at fault
    assert len(problems) == 1 and "'tokens'" in problems[0] and "data.sequence" in problems[0], str(error.value)
    assert "Traceback" not in str(error.value)


def test_pack_with_overflow_error_names_the_key_and_length_when_an_example_is_longer(files):
    """overflow: error in pack mode is checked where the stream is cut into chunks (before any window)."""
    assert max(LENGTHS) > LENGTH
    pipeline = Pipeline.from_config(make_config(files, "pack", overflow="error"))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"an example of tokens is longer than length {LENGTH}"):
        for _ in pipeline.build():
            pass

"""Sequence packing (tpu_pipeline.pipeline.sequences.packing): properties of pack_window against an
independent Python decoder and reference packer, and the Packer stage end to end."""
from __future__ import annotations

import collections
import functools
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.sequences import placement
from tpu_pipeline.pipeline.sequences import placement_without_xla as without_xla
from tpu_pipeline.pipeline.sequences.packing import ALGORITHMS, Packer, pack_window
from tpu_pipeline.pipeline.stages.base import StageContext

pytestmark = pytest.mark.tf_builds

KEYS = ("inputs", "targets", "extra")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Item = tuple  # one tuple of tokens per key


# ----------------------------------------------------------------------------- reference (pure Python)

def expected_items(examples: list[dict], lengths: dict[str, int], overflow: str) -> list[Item]:
    """What must be packed, in window order: heads, or aligned chunks; examples with no token dropped."""
    items = []
    for example in examples:
        if overflow == "split":
            chunks = max(math.ceil(len(example[k]) / n) for k, n in lengths.items())
        else:
            chunks = 1 if any(example[k] for k in lengths) else 0
        for c in range(chunks):
            items.append(tuple(tuple(example[k][c * n:(c + 1) * n]) for k, n in lengths.items()))
    return items


def reference_rows(items: list[Item], lengths: dict[str, int], algorithm: str) -> list[list[Item]]:
    """First fit / best fit as documented: combined size = sum of tokens / length (as exact integers)."""
    limits = list(lengths.values())
    lcm = math.lcm(*limits)
    weights = [lcm // n for n in limits]
    combined = lambda sizes: sum(s * w for s, w in zip(sizes, weights))  # noqa: E731
    sizes = [[len(part) for part in item] for item in items]
    order = list(range(len(items)))
    if algorithm != "first_fit":
        order.sort(key=lambda i: -combined(sizes[i]))  # Python's sort is stable
    rooms: list[list[int]] = []
    rows: list[list[Item]] = []
    for i in order:
        fitting = [r for r, room in enumerate(rooms) if all(a >= b for a, b in zip(room, sizes[i]))]
        if not fitting:
            rooms.append(list(limits))
            rows.append([])
            fitting = [len(rooms) - 1]
        if algorithm == "best_fit_decreasing":
            row = min(fitting, key=lambda r: (combined([a - b for a, b in zip(rooms[r], sizes[i])]), r))
        else:
            row = fitting[0]
        rooms[row] = [a - b for a, b in zip(rooms[row], sizes[i])]
        rows[row].append(items[i])
    return rows


def next_fit_rows(sizes: list[int], length: int) -> int:
    """seqio's packer: one open row, closed as soon as an example does not fit."""
    rows, room = 0, 0
    for size in sizes:
        if size > room:
            rows, room = rows + 1, length
        room -= size
    return rows


def decode(packed: dict, lengths: dict[str, int]) -> list[list[Item]]:
    """Rows back to items, checking the row format on the way (independent of the code under test)."""
    first = next(iter(lengths))
    num_rows = packed[first].shape[0]
    rows = []
    for r in range(num_rows):
        segments_per_key = []
        for key, length in lengths.items():
            names = (key, f"{key}_segment_ids", f"{key}_positions")
            values, seg, pos = (np.asarray(packed[name])[r] for name in names)
            assert values.shape == seg.shape == pos.shape == (length,)
            used = int(np.count_nonzero(seg))
            assert (seg[:used] > 0).all() and (seg[used:] == 0).all(), f"padding before the end of row {r}: {seg}"
            assert (values[used:] == 0).all() and (pos[used:] == 0).all()
            assert (np.diff(seg[:used]) >= 0).all(), f"segments out of order or split in row {r}: {seg}"
            runs = {}
            for s in np.unique(seg[:used]):
                where = np.flatnonzero(seg == s)
                assert (np.diff(where) == 1).all(), f"segment {s} not contiguous in row {r}"
                assert (pos[where] == np.arange(len(where))).all(), f"positions of segment {s} in row {r}: {pos[where]}"
                runs[int(s)] = tuple(int(v) for v in values[where])
            segments_per_key.append(runs)
        count = int(packed["_row_examples"][r])
        present = set().union(*(set(runs) for runs in segments_per_key))
        assert present == set(range(1, count + 1)), f"row {r}: segments {sorted(present)}, _row_examples {count}"
        rows.append([tuple(runs.get(s, ()) for runs in segments_per_key) for s in range(1, count + 1)])
    return rows


def ragged_window(examples: list[dict], keys, dtype=tf.int32) -> dict[str, tf.RaggedTensor]:
    return {k: tf.ragged.constant([e[k] for e in examples], dtype=dtype, ragged_rank=1, inner_shape=())
            if examples else tf.RaggedTensor.from_row_lengths(tf.zeros([0], dtype), tf.zeros([0], tf.int64))
            for k in keys}


def check_packing(examples: list[dict], lengths: dict[str, int], algorithm: str, overflow: str, packed: dict) -> None:
    packed = {k: np.asarray(v) for k, v in packed.items()}
    rows = decode(packed, lengths)
    items = expected_items(examples, lengths, overflow)
    assert collections.Counter(i for row in rows for i in row) == collections.Counter(items)
    assert rows == reference_rows(items, lengths, algorithm)
    num_rows = len(rows)
    for k, (key, length) in enumerate(lengths.items()):
        tokens = sum(len(item[k]) for item in items)
        assert num_rows >= math.ceil(tokens / length)
    assert all(row for row in rows), "an empty row"
    assert packed["_row"].tolist() == list(range(num_rows))
    assert packed["_window_rows"].tolist() == [num_rows] * num_rows
    assert packed["_window_examples"].tolist() == [len(examples)] * num_rows


# ----------------------------------------------------------------------------- strategies

@st.composite
def windows(draw, overflows=("truncate", "split")):
    """1-3 keys of different lengths, up to 12 examples, tokens 0..4 (0 is a real token), some too long."""
    keys = KEYS[:draw(st.integers(1, 3))]
    lengths = {k: draw(st.integers(1, 10)) for k in keys}
    examples = draw(st.lists(
        st.fixed_dictionaries({k: st.lists(st.integers(0, 4), max_size=2 * n + 1) for k, n in lengths.items()}),
        max_size=12))
    return examples, lengths, draw(st.sampled_from(ALGORITHMS)), draw(st.sampled_from(overflows))


# ----------------------------------------------------------------------------- pack_window properties

@SETTINGS
@given(windows())
def test_pack_window_eager_properties(case):
    examples, lengths, algorithm, overflow = case
    window = ragged_window(examples, lengths)
    packed = pack_window(window, lengths, algorithm, overflow)
    check_packing(examples, lengths, algorithm, overflow, packed)
    again = pack_window(window, lengths, algorithm, overflow)
    assert all(np.array_equal(packed[k], again[k]) for k in packed), "not deterministic"


@functools.lru_cache(maxsize=None)
def graph_packer(lengths: tuple, algorithm: str, overflow: str, jit_compile: bool):
    spec = {k: tf.RaggedTensorSpec([None, None], tf.int32, 1, tf.int64) for k, _ in lengths}
    return tf.function(lambda w: pack_window(w, dict(lengths), algorithm, overflow, jit_compile),
                       input_signature=[spec])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_pack_window_graph_properties(algorithm, data):
    """Inside a tf.function (as in a tf.data map), with and without XLA for the placement loop."""
    lengths = {"inputs": 7, "targets": 3}
    overflow = data.draw(st.sampled_from(["truncate", "split"]))
    examples = data.draw(st.lists(st.fixed_dictionaries(
        {"inputs": st.lists(st.integers(0, 3), max_size=12), "targets": st.lists(st.integers(0, 3), max_size=5)}),
        min_size=1, max_size=40))
    window = ragged_window(examples, lengths)
    packed = graph_packer(tuple(lengths.items()), algorithm, overflow, True)(window)
    check_packing(examples, lengths, algorithm, overflow, packed)
    plain = graph_packer(tuple(lengths.items()), algorithm, overflow, False)(window)
    assert all(np.array_equal(packed[k], plain[k]) for k in packed), "XLA and graph placements differ"


def test_placement_without_xla_gives_the_rows_of_the_xla_path() -> None:
    """The TPU build has no XLA for the CPU and places on TF's executor (placement.place's other branch): it must
    give the very rows the XLA path gives, for every algorithm, on fixed windows with many ties and two keys whose
    weights differ (hypothesis's few small draws above seldom meet a window where the two would part)."""
    lengths = {"inputs": 7, "targets": 3}
    rng = np.random.default_rng(5)
    windows = []
    for index in range(48):
        if index % 2:  # many items of few sizes in one key: best fit meets ties between rows
            examples = [{"inputs": [1] * int(rng.choice([2, 3, 4])), "targets": []} for _ in range(rng.integers(8, 40))]
        else:  # two keys: best fit weighs the keys' sizes (3 and 7 here)
            examples = [{"inputs": rng.integers(0, 4, rng.integers(0, 13)).tolist(),
                         "targets": rng.integers(0, 4, rng.integers(0, 6)).tolist()} for _ in range(rng.integers(8, 40))]
        windows.append(ragged_window(examples, lengths))
    one_key = {"inputs": 64}  # one key has leaner ops without XLA; windows of many loop steps (UNROLLED items each)
    one_key_windows = [ragged_window([{"inputs": [1] * int(size)} for size in
                                      np.minimum(rng.lognormal(np.log(n / 12), 0.8, n).round(), 80)], one_key)
                       for n in (15, 16, 17, 120, 300)]
    for algorithm in ALGORITHMS:
        for keys, cases in ((lengths, windows), (one_key, one_key_windows)):
            xla, plain = (graph_packer(tuple(keys.items()), algorithm, "truncate", jit) for jit in (True, False))
            for index, window in enumerate(cases):
                with_xla, without = xla(window), plain(window)
                assert all(np.array_equal(with_xla[k], without[k]) for k in with_xla), (
                    f"{algorithm}: window {index} of keys {list(keys)} is placed differently without XLA")


@functools.lru_cache(maxsize=None)
def executor_loops(best_fit: bool) -> dict:
    """XLA's item-by-item loop (run by TF's executor here, so under either TensorFlow) and the two loops of
    placement_without_xla, each on a window's sizes in placement order."""
    def room_for(sizes, limits):
        return tf.tile(limits[None, :], [placement._row_bound(sizes, limits) + 1, 1])

    def item_by_item(sizes, limits, weights):
        return placement._place_loop(tf.pad(sizes, [[0, 1], [0, 0]]), tf.shape(sizes)[0], room_for(sizes, limits),
                                     weights, best_fit)

    def runs(sizes, limits, weights):
        room = room_for(sizes, limits)
        rows, room = without_xla._place_runs(sizes, without_xla._run_starts(sizes), room, weights, best_fit)
        return rows, tf.reduce_min(room) >= 0

    def unrolled(sizes, limits, weights):
        rows, room = without_xla._place_unrolled(sizes, room_for(sizes, limits), weights, best_fit)
        return rows, tf.reduce_min(room) >= 0

    def split(sizes, limits, weights):
        return without_xla._place_split(sizes, room_for(sizes, limits), weights, best_fit)

    return {name: tf.function(loop, reduce_retracing=True, autograph=False)
            for name, loop in (("item by item", item_by_item), ("runs", runs), ("unrolled", unrolled),
                                       ("split", split))}


def test_each_loop_without_xla_places_each_item_where_the_item_by_item_loop_does() -> None:
    """The TPU build's placement has two loops (runs of equal items, UNROLLED items a step) and splits a window
    between them: each, and the split, must give the rows of the loop XLA compiles, on every algorithm,
    whichever window it is given; windows with many ties (few sizes), with sizes that seldom repeat, two
    keys, empty items, and one item."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        keys = 1 + trial % 2
        limits = rng.integers(4, 40, keys).astype(np.int32)
        count = 1 if trial == 7 else int(rng.integers(1, 150))
        most = 6 if trial % 4 < 2 else 40  # few sizes (long runs of equal items) or many
        sizes = np.minimum(rng.integers(0, most, (count, keys)), limits).astype(np.int32)
        algorithm = ALGORITHMS[trial % 3]
        weights = placement.size_weights([int(x) for x in limits])
        order = placement.placement_order(tf.constant(sizes), weights, algorithm != "first_fit").numpy()
        args = (tf.constant(sizes[order].reshape(count, keys)), tf.constant(limits), tf.constant(weights, tf.int64))
        loops = executor_loops(algorithm == "best_fit_decreasing")
        expected, fitted = loops["item by item"](*args)
        assert bool(fitted)
        for name in ("runs", "unrolled", "split"):
            rows, fitted = loops[name](*args)
            assert bool(fitted) and np.array_equal(rows.numpy()[:count], expected.numpy()[:count]), (
                f"{algorithm}, {keys} key(s), {count} items: the {name} loop places them otherwise")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_pack_window_many_short_examples(data):
    """Many items, few rows: the placement searches a bounded number of rows (`_row_bound`)."""
    keys = KEYS[:data.draw(st.integers(1, 2))]
    lengths = {k: data.draw(st.integers(16, 48)) for k in keys}
    examples = data.draw(st.lists(st.fixed_dictionaries({k: st.lists(st.integers(0, 2), max_size=6) for k in keys}),
                                  min_size=40, max_size=300))
    algorithm = data.draw(st.sampled_from(ALGORITHMS))
    packed = pack_window(ragged_window(examples, lengths), lengths, algorithm)
    check_packing(examples, lengths, algorithm, "truncate", packed)


def test_dtype_kept_and_token_zero_is_a_token():
    window = {"x": tf.ragged.constant([[0, 0, 0], [0], [5, 0]], dtype=tf.int64)}
    packed = pack_window(window, {"x": 4}, "first_fit")
    assert packed["x"].dtype == tf.int64
    assert packed["x_segment_ids"].dtype == packed["x_positions"].dtype == tf.int32
    assert packed["x_segment_ids"].numpy().tolist() == [[1, 1, 1, 2], [1, 1, 0, 0]]
    assert packed["x"].numpy().tolist() == [[0, 0, 0, 0], [5, 0, 0, 0]]


def test_empty_window_gives_no_rows():
    packed = pack_window(ragged_window([], ["x"]), {"x": 4})
    assert packed["x"].shape == (0, 4) and packed["_row"].shape == (0,)


def test_decreasing_packs_at_least_as_densely_as_next_fit():
    """On a skewed (lognormal) distribution: never more rows than next fit, never fewer than the bound."""
    rng = np.random.default_rng(7)
    length = 128
    sizes = np.clip(rng.lognormal(np.log(30), 1.0, 512).astype(int), 1, length)
    examples = [{"x": [1] * int(n)} for n in sizes]
    next_fit = next_fit_rows(sizes.tolist(), length)
    bound = math.ceil(sizes.sum() / length)
    packed_rows = {}
    for algorithm in ALGORITHMS:
        packed = pack_window(ragged_window(examples, ["x"]), {"x": length}, algorithm)
        packed_rows[algorithm] = int(packed["x"].shape[0])
        assert bound <= packed_rows[algorithm] <= next_fit, (algorithm, bound, packed_rows[algorithm], next_fit)
    assert packed_rows["first_fit_decreasing"] < next_fit
    assert packed_rows["best_fit_decreasing"] < next_fit


def test_overflow_error_names_the_key_and_lengths():
    window = {"inputs": tf.ragged.constant([[1, 2], [3]]), "targets": tf.ragged.constant([[1], [0, 0, 0, 0, 0]])}
    message = r"sequence.lengths.targets=4, but example 1 of a packing window has 5 tokens \(overflow=error\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        pack_window(window, {"inputs": 8, "targets": 4}, overflow="error")
    fn = tf.function(lambda w: pack_window(w, {"inputs": 8, "targets": 4}, overflow="error"))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        fn(window)
    assert pack_window(window, {"inputs": 8, "targets": 5}, overflow="error")["targets"].shape == (2, 5)


@pytest.mark.parametrize("kwargs, match", [
    ({"algorithm": "next_fit"}, "sequence.algorithm='next_fit' is unknown"),
    ({"overflow": "drop"}, "sequence.overflow='drop' is unknown"),
    ({"lengths": {"x": 0}}, r"sequence.lengths.x=0"),
    ({"window": 0}, "sequence.window=0"),
])
def test_pack_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Packer(**{"lengths": {"x": 4}, "window": 8, **kwargs})


# ----------------------------------------------------------------------------- the Packer stage

def lm_examples(count: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"inputs": rng.integers(0, 5, rng.integers(0, 20)).tolist(),
             "targets": rng.integers(0, 5, rng.integers(1, 7)).tolist()} for _ in range(count)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_pack_stage_end_to_end_with_partial_last_window(algorithm):
    examples = lm_examples(27)
    lengths = {"inputs": 16, "targets": 8}
    source = tf.data.Dataset.from_tensor_slices(ragged_window(examples, lengths))
    stage = Packer(lengths, window=8, algorithm=algorithm, overflow="split")
    packed = stage.apply(source, StageContext())
    for key in lengths:
        for name in (key, f"{key}_segment_ids", f"{key}_positions"):
            assert packed.element_spec[name] == tf.TensorSpec([lengths[key]], tf.int32)
    assert not any(k.startswith("_") for k in packed.element_spec)
    rows = list(packed.as_numpy_iterator())
    got, expected = [], []
    for start in range(0, len(examples), 8):  # windows of 8, the last one of 3
        expected += expected_items(examples[start:start + 8], lengths, "split")
    stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    stacked["_row_examples"] = np.array([max(int(r[f"{k}_segment_ids"].max()) for k in lengths) for r in rows])
    for row in decode(stacked, lengths):
        got += row
    assert collections.Counter(got) == collections.Counter(expected)


def test_pack_stage_from_generator_and_metadata():
    examples = lm_examples(11, seed=3)
    source = tf.data.Dataset.from_generator(
        lambda: ({k: np.array(v, np.int32) for k, v in e.items()} for e in examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in ("inputs", "targets")})
    packed = Packer({"inputs": 24, "targets": 8}, window=4, metadata=True).apply(source, StageContext())
    assert packed.element_spec["inputs"].shape == [24] and packed.element_spec["targets_positions"].shape == [8]
    rows = list(packed.as_numpy_iterator())
    ends = [r for r in rows if r["_row"] == r["_window_rows"] - 1]
    assert [int(r["_window_examples"]) for r in ends] == [4, 4, 3]
    items = expected_items(examples, {"inputs": 24, "targets": 8}, "truncate")
    assert sum(int(r["_row_examples"]) for r in rows) == len(items)


def test_pack_stage_refuses_a_feature_it_cannot_place():
    source = tf.data.Dataset.from_tensor_slices({"inputs": tf.ragged.constant([[1, 2], [3]]), "id": [7, 8]})
    with pytest.raises(ConfigError, match="feature 'id' is not in sequence.keys: a packed row has no place for it; "
                                          "drop it with an op or add it to sequence.keys"):
        Packer({"inputs": 4}, window=2).apply(source, StageContext())
    with pytest.raises(ConfigError, match="sequence.keys names 'targets'"):
        Packer({"inputs": 4, "targets": 4, "id": 1}, window=2).apply(source, StageContext())
    with pytest.raises(ConfigError, match="feature 'id' is .* not a 1-D sequence"):
        Packer({"inputs": 4, "id": 1}, window=2).apply(source, StageContext())


def test_pack_stage_takes_ragged_batches_as_windows():
    """window=None: each element is already a ragged batch (a batched parse with a RaggedFeature)."""
    examples = lm_examples(10, seed=5)
    records = []
    for e in examples:
        feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in e.items()}
        records.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    spec = {k: tf.io.RaggedFeature(tf.int64) for k in ("inputs", "targets")}
    parsed = tf.data.Dataset.from_tensor_slices(records).batch(4).map(lambda r: tf.io.parse_example(r, spec))
    lengths = {"inputs": 20, "targets": 6}
    packed = Packer(lengths, window=None).apply(parsed, StageContext())
    assert packed.element_spec["inputs"] == tf.TensorSpec([20], tf.int64)
    rows = list(packed.as_numpy_iterator())
    stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    stacked["_row_examples"] = np.array([max(int(r[f"{k}_segment_ids"].max()) for k in lengths) for r in rows])
    got = [item for row in decode(stacked, lengths) for item in row]
    assert collections.Counter(got) == collections.Counter(expected_items(examples, lengths, "truncate"))
    with pytest.raises(ConfigError, match="already ragged batches of examples: pack each as it comes with "
                                          "sequence.window=None"):
        Packer(lengths, window=8).apply(parsed, StageContext())
    single = tf.data.Dataset.from_tensor_slices(ragged_window(examples, lengths))
    with pytest.raises(ConfigError, match="sequence.window=None packs elements that are ragged batches"):
        Packer(lengths, window=None).apply(single, StageContext())

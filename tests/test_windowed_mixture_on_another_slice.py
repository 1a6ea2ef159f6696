"""A packed mixture resumed on another number of hosts (issue 51): the rows each old host had left, rebuilt as its
saved mixture made them with every source ending at the end of its epoch E_s, dealt in turns; then each new host
packs its own mixture, every source from its epoch E_s + 1. And a bucketed mixture, whose one whole stream every
host reads, regrouped.

Each segment goes the way `train` goes with TF_CONFIG workers (as tests/test_pack_on_another_slice.py): every
host's `WindowedPosition` and `MixtureState` restore the checkpoint, read their stream for some steps, and record
their places; the chief's checkpoint holds every host's. Example i of a source is its first id + i repeated, so
with sources that end (exhausted: drop) every example must be seen exactly once, whichever slices read it.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from test_bucket_on_another_slice import GLOBAL_BATCH, cluster, examples_of, packed_rows_of
from test_pack_on_another_slice import into_chief
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.records.writer import write_split
from tpu_pipeline.train.mixture_state import MIXTURE_KEY, MixtureState
from tpu_pipeline.train.windowed_position import POSITION_KEY, WindowedPosition

pytestmark = pytest.mark.tf_builds

SOURCES = {"web": (1, 96), "code": (1001, 48)}  # name: (first id, examples)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pack_mixture")
    rng = np.random.default_rng(7)
    found = {}
    for name, (first, count) in SOURCES.items():
        def example(i: int, first: int = first) -> bytes:
            tokens = [first + i] * int(rng.integers(2, 64))
            feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))}
            return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

        write_split((example(i) for i in range(count)), str(root / name), "train", 2)
        found[name] = str(root / name / "train-*.tfrecord")
    return found


def packed_mixture(files: dict[str, str], exhausted: str | tuple[str, str], mode: str = "pack",
                   weights: tuple[float, float] | None = None) -> Pipeline:
    """Rows of 64 from pools of 2 windows of 8 chunks: several pools a host an epoch, so pools straddle epochs
    (`mode`: pack, or bucket-examples / bucket-tokens).
    `exhausted`: both sources', or each one's (then web weighs 0.8: code stops the mixture past web's first epochs)."""
    policies = (exhausted, exhausted) if isinstance(exhausted, str) else exhausted
    weights = weights or ((0.6, 0.4) if isinstance(exhausted, str) else (0.8, 0.2))
    sources = [{"name": name, "weight": weight, "exhausted": policy,
                "source": {"type": "tfrecord", "files": files[name]}}
               for name, weight, policy in zip(SOURCES, weights, policies)]
    data = {"mixture": {"sources": sources}, "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": 64, "mode": mode.split("-")[0], "window": 8, "overflow": "truncate",
                         **({"row_shuffle": 2} if mode == "pack" else {"bucket_batch": mode.split("-")[1]})},
            "batch_size": GLOBAL_BATCH, "repeat": "forever" if "repeat" in policies else 1, "seed": 4,
            "shuffle": {"buffer_size": 32}, **({"drop_remainder": False} if mode == "pack" else {})}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


def segment(files: dict[str, str], exhausted: str | tuple[str, str], hosts: int, replicas: int, first: int,
            steps: int | None, read: str | None, write: str, mode: str = "pack",
            weights: tuple[float, float] | None = None) -> tuple[list[int], str]:
    """Every host of a slice from global step `first`, restored from checkpoint `read` as `train` restores it:
    `steps` steps of its stream (None: to its end, nothing saved), its place recorded; the chief's checkpoint, with
    every host's place, to `write`."""
    seen, line, chief = [], "", None
    for worker in range(hosts):
        pipeline = packed_mixture(files, exhausted, mode, weights)
        mixture = MixtureState(pipeline, hosts)
        position = WindowedPosition(pipeline, cluster(hosts, replicas, worker), mixture=mixture)
        checkpoint = tf.train.Checkpoint(**{POSITION_KEY: position, MIXTURE_KEY: mixture})
        if read:
            position.check_saved(read)
            checkpoint.read(read).assert_consumed()
            line = position.resume()
            lines = mixture.resume(lambda context: position.saved(context.input_pipeline_id), replicas)
            line = "; ".join([line, *lines])
            position.pipeline_of = mixture.pipeline
        stream = iter(position.stream(tf.distribute.InputContext(hosts, worker, replicas), first))
        for _ in range(steps * replicas // hosts if steps is not None else 1 << 30):
            batch = next(stream, None)
            if batch is None:
                break
            seen += packed_rows_of(batch) if mode == "pack" else examples_of(batch)  # bucket-<bucket_batch>
        if steps is None:
            continue
        position.record(first + steps)
        if chief is None:
            saver = checkpoint  # the chief's: the first worker's
        chief = into_chief(chief, position, worker)
    if steps is not None:
        saver.write(write)
    return seen, line


def every_example() -> list[int]:
    return sorted(first + i for first, count in SOURCES.values() for i in range(count))


@pytest.mark.parametrize("slices", [
    [(2, 4, 2), (1, 4, None)],  # 2 -> 1, to the end
    [(2, 4, 2), (1, 2, 1), (2, 4, None)],  # 2 -> 1, stopped inside the dealt rows -> 2
])
def test_a_packed_mixture_that_ends_reads_each_example_once_across_slices(files, tmp_path, slices):
    seen, step, read, lines = [], 0, None, []
    for number, (hosts, replicas, steps) in enumerate(slices):
        write = str(tmp_path / f"ckpt-{number}")
        part, line = segment(files, "drop", hosts, replicas, step, steps, read, write)
        seen, lines = seen + part, lines + [line]
        step, read = step + (steps or 0), write
    counts = collections.Counter(seen)
    assert sorted(counts) == every_example(), f"{len(every_example()) - len(counts)} example(s) never seen"
    assert set(counts.values()) == {1}, {example: count for example, count in counts.items() if count != 1}
    assert "are dealt to" in lines[1] and "the checkpoint" in lines[1], lines


@pytest.mark.parametrize("first_steps", [2, 4])  # either has a host whose pool straddles an epoch's end of web
def test_a_packed_mixture_of_a_repeating_source_and_one_that_stops_goes_on_exactly(files, tmp_path, first_steps):
    """web repeats, code stops the mixture at its end (exhausted: stop), so the run ends with every pool delivered:
    2 hosts → 1 → 2 to the end; web's examples m or m + 1 times (its last epoch cut by the stop), code's once."""
    seen, step, read = [], 0, None
    for number, (hosts, replicas, steps) in enumerate([(2, 4, first_steps), (1, 2, 2), (2, 4, None)]):
        write = str(tmp_path / f"ckpt-{number}")
        part, _ = segment(files, ("repeat", "stop"), hosts, replicas, step, steps, read, write)
        seen, step, read = seen + part, step + (steps or 0), write
    web, code = SOURCES.values()
    counts = collections.Counter(example for example in seen if example < code[0])
    whole = sum(counts.values()) // web[1]
    assert whole >= 1 and sorted(counts) == list(range(1, 1 + web[1])), f"{web[1] - len(counts)} web example(s) unseen"
    assert set(counts.values()) <= {whole, whole + 1}, collections.Counter(counts.values())
    assert collections.Counter(example for example in seen if example >= code[0]) == collections.Counter(
        range(code[0], code[0] + code[1]))


def test_weights_changed_while_the_dealt_rows_are_read_take_effect_in_each_hosts_own_mixture(files, tmp_path):
    """2 hosts → 1 (stopped inside the dealt rows) → the same host with other weights: the rows keep the old ones,
    its own mixture (not begun) mixes with the new ones; every example once."""
    seen, step, read, lines = [], 0, None, []
    for number, (hosts, steps, weights) in enumerate([(2, 2, None), (1, 1, None), (1, None, (0.3, 0.7))]):
        write = str(tmp_path / f"ckpt-{number}")
        part, line = segment(files, "drop", hosts, 4 if hosts == 2 else 2, step, steps, read, write, weights=weights)
        seen, lines, step, read = seen + part, lines + [line], step + (steps or 0), write
    assert sorted(seen) == every_example()
    assert ("data.mixture: weights changed since the checkpoint (web 0.6 -> 0.3, code 0.4 -> 0.7); they take effect "
            "from the first example of its own mixture, after the rows dealt from the earlier slice") in lines[2], lines


@pytest.mark.parametrize("bucket_batch", ["examples", "tokens"])
def test_a_bucketed_mixture_regroups_on_another_number_of_hosts(files, tmp_path, bucket_batch):
    """bucket: every host reads the mixture's one whole stream and keeps its replicas' batches, so its place is the
    same on any slice: 2 hosts → 1 (inside the stream) → 2 to the end, every example once."""
    seen, step, read, lines = [], 0, None, []
    for number, (hosts, replicas, steps) in enumerate([(2, 4, 2), (1, 2, 3), (2, 4, None)]):
        write = str(tmp_path / f"ckpt-{number}")
        part, line = segment(files, "drop", hosts, replicas, step, steps, read, write, mode=f"bucket-{bucket_batch}")
        seen, lines, step, read = seen + part, lines + [line], step + (steps or 0), write
    assert sorted(seen) == every_example()
    assert "the checkpoint 2 hosts (4 replicas)" in lines[1], lines
    assert ("each step's batch now cut for 2 replicas" if bucket_batch == "examples" else
            "its other examples batched for 2 replicas") in lines[1], lines

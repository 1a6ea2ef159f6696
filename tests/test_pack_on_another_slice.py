"""A packed stream resumed on another number of hosts (issue 51): the rows the checkpoint's hosts had left of
their epoch, dealt in turns to the new hosts, then each one's own shard; and again on a third slice before
those rows are done.

Each segment here goes the way `train` goes with TF_CONFIG workers: every host's `WindowedPosition` restores the
checkpoint (`check_saved`, `resume`), reads its stream as fit takes it for some steps, and records its place;
the chief's checkpoint holds every host's (the exchange, done here by hand). Examples are read back from the
rows' own tokens (example i is i + 1 repeated), so every example of the two epochs must be seen exactly twice:
none lost, none doubled, no chunk of it twice.
"""
from __future__ import annotations

import collections
import json

import pytest
import tensorflow as tf

from test_bucket_on_another_slice import GLOBAL_BATCH, cluster, packed_rows_of, write_examples
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.core.row_remainder import IN_REST, RowRemainder, delivered_epoch, epoch_to_deal
from tpu_pipeline.train.windowed_position import POSITION_KEY, WindowedPosition

pytestmark = pytest.mark.tf_builds

EXAMPLES = 160  # 80 a host of 2: an epoch of ~37 rows there, ~5 steps of 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_examples(tmp_path_factory.mktemp("pack_slice"), EXAMPLES)


def packed(files: str, repeat: int = 2) -> Pipeline:
    """Rows of 64 from pools of 2 windows of 16 chunks: ~2.5 pools a host an epoch, so pools straddle epochs."""
    data = {"source": {"type": "tfrecord", "files": files},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": 64, "mode": "pack", "window": 16, "overflow": "truncate",
                         "row_shuffle": 2},
            "batch_size": GLOBAL_BATCH, "repeat": repeat, "seed": 4, "shuffle": {"buffer_size": 64},
            "drop_remainder": False}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


def segment(files: str, hosts: int, replicas: int, first: int, steps: int | None, read: str | None,
            write: str | None) -> tuple[list[int], str, WindowedPosition]:
    """Every host of a slice from global step `first`: restored from checkpoint `read`, `steps` steps of its stream
    (None: to its end), its place recorded; the chief's checkpoint, with every host's place, written to `write`."""
    seen, line, chief = [], "", None
    for worker in range(hosts):
        position = WindowedPosition(packed(files), cluster(hosts, replicas, worker))
        if read:
            position.check_saved(read)
            tf.train.Checkpoint(**{POSITION_KEY: position}).read(read).assert_consumed()
            line = position.resume()
        stream = iter(position.stream(tf.distribute.InputContext(hosts, worker, replicas), first))
        for _ in range(steps * replicas // hosts if steps is not None else 1 << 30):
            batch = next(stream, None)
            if batch is None:
                break
            seen += packed_rows_of(batch)
        if write is None:
            continue
        position.record(first + steps)
        chief = into_chief(chief, position, worker)
    if write is not None:
        tf.train.Checkpoint(**{POSITION_KEY: chief}).write(write)
    return seen, line, chief


def into_chief(chief: WindowedPosition | None, position: WindowedPosition, worker: int) -> WindowedPosition:
    """The chief's position once worker `worker` recorded its place: the exchange before a save leaves every
    worker's place in the chief's (the first worker is the chief)."""
    if chief is None:
        return position
    for name in ("example", "chunk", "in_window"):
        merged = getattr(chief, name).numpy()
        merged[worker] = getattr(position, name).numpy()[worker]
        getattr(chief, name).assign(merged)
    return chief


def assert_twice(seen: list[int]) -> None:
    counts = collections.Counter(seen)
    assert sorted(counts) == list(range(1, EXAMPLES + 1)), f"{EXAMPLES - len(counts)} example(s) never seen"
    wrong = {example: count for example, count in counts.items() if count != 2}
    assert not wrong, f"{len(wrong)} example(s) not seen once an epoch, e.g. {sorted(wrong.items())[:5]}"


@pytest.mark.parametrize("was, steps, now", [((2, 4), 3, (1, 4)), ((1, 4), 5, (2, 8)), ((2, 8), 1, (1, 2))])
def test_a_packed_stream_goes_on_exactly_on_another_number_of_hosts(files, tmp_path, was, steps, now):
    before, _, _ = segment(files, *was, 0, steps, None, str(tmp_path / "a"))
    after, line, _ = segment(files, *now, steps, None, str(tmp_path / "a"), None)
    assert_twice(before + after)
    assert f"the checkpoint {was[0]} host" in line and "are dealt to" in line, line


@pytest.mark.parametrize("middle_steps", [1, 6])
def test_a_third_slice_before_the_dealt_rows_are_done(files, tmp_path, middle_steps):
    """2 hosts → 1 host (stopped inside the 2 hosts' rows: 1 step; or past them: 6) → 2 hosts: what the one host had
    not read of them heads the next remainder, then what it had left of its own epoch."""
    first, _, _ = segment(files, 2, 4, 0, 3, None, str(tmp_path / "a"))
    middle, _, one = segment(files, 1, 2, 3, middle_steps, str(tmp_path / "a"), str(tmp_path / "b"))
    saved = one.rows_remainder.numpy().decode()
    if middle_steps == 1:  # still in the rows: its place is its next row, the remainder kept
        assert int(one.chunk.numpy()[0]) == IN_REST and RowRemainder.from_json(json.loads(saved)).hosts == 2
    else:  # past them: a plain place, the remainder dropped from the checkpoint
        assert int(one.chunk.numpy()[0]) != IN_REST and saved == ""
    last, line, _ = segment(files, 2, 4, 3 + middle_steps, None, str(tmp_path / "b"), None)
    assert_twice(first + middle + last)
    assert "the checkpoint 1 host" in line, line
    assert ("an earlier slice" in line) == (middle_steps == 1), line


def test_as_many_hosts_go_on_dealing_the_rows(files, tmp_path):
    """Saved while the rows are dealt, on as many hosts: each goes on from its next row, then its own shard."""
    first, _, _ = segment(files, 2, 4, 0, 3, None, str(tmp_path / "a"))
    second, _, _ = segment(files, 1, 4, 3, 1, str(tmp_path / "a"), str(tmp_path / "b"))
    third, line, _ = segment(files, 1, 4, 4, None, str(tmp_path / "b"), None)
    assert_twice(first + second + third)
    assert line.startswith("the input pipelines go on with the rows 2 hosts had left of data epoch"), line


def test_the_epoch_to_deal_covers_every_delivered_row():
    """E is the last epoch any delivered chunk is in: a place inside a pool counts the pool's end (its other rows
    go with it), a place at a pool's start the chunk before it; hosts still reading older rows count that one's."""
    assert delivered_epoch(100, 0, 100) == 0 and delivered_epoch(100, 2, 100) == 1 and delivered_epoch(0, 0, 50) == -1
    ends = {0: (230, 0), 1: None}
    assert epoch_to_deal(((90, 0, 3), (120, 0, 0)), 100, None, ends.get, 9) == 2
    assert epoch_to_deal(((90, 0, 3), (120, 0, 5)), 100, None, ends.get, 9) == 9  # the stream ends in that pool
    older = RowRemainder(((5, 0, 1),), 100, 3, 4)
    assert epoch_to_deal(((7, IN_REST, 1), (400, 0, 0)), 100, older, ends.get, 9) == 3

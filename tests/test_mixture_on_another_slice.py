"""A mixture of example streams resumed on another number of hosts (issue 51): what the checkpoint's hosts had left
of each source's epoch, dealt in turns to the new hosts, then each one's own mixture, every source from its next
epoch; and again on a third slice before that rest is done.

Each segment goes the way `train` goes: every host's `ExampleLayout` and `MixtureState` restore the checkpoint,
read their streams for some steps as fit takes them, and record the layout. Each record says its source and
its id, so every source's records must be seen m or m + 1 times over the run (m: its whole epochs), none
skipped and none doubled within an epoch, whichever slices read them.
"""
from __future__ import annotations

import collections

import pytest
import tensorflow as tf

from test_bucket_on_another_slice import cluster
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.core.element_keys import SOURCE_KEY
from tpu_pipeline.pipeline.core.remainder import Layout, MixedRemainder
from tpu_pipeline.testing.data import write_tfrecords
from tpu_pipeline.train.example_layout import LAYOUT_KEY, ExampleLayout
from tpu_pipeline.train.mixture_state import MIXTURE_KEY, MixtureState

pytestmark = pytest.mark.tf_builds

SOURCES = {"web": 48, "code": 24}  # records a source: 24 and 12 a host of 2, epochs that end at different steps
GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mixed_slice")
    return {name: write_tfrecords(root / name, {}, count, num_shards=2) for name, count in SOURCES.items()}


def mixed(files: dict[str, str], weights: tuple[float, float] = (0.6, 0.4), exhausted: str = "repeat") -> Pipeline:
    sources = [{"name": name, "weight": weight, "exhausted": exhausted,
                "source": {"type": "tfrecord", "files": files[name]}} for name, weight in zip(SOURCES, weights)]
    data = {"mixture": {"sources": sources}, "features": {"id": {"dtype": "int64"}}, "batch_size": GLOBAL_BATCH,
            "seed": 4, "shuffle": {"buffer_size": 16}, "repeat": "forever" if exhausted == "repeat" else 1,
            "drop_remainder": False}
    return Pipeline.from_config(config_from_dict({"data": data}).data)


def segment(files: dict[str, str], hosts: int, first: int, steps: int, read: str | None, write: str,
            weights: tuple[float, float] = (0.6, 0.4), exhausted: str = "repeat") -> tuple[list[tuple[str, int]], str]:
    """Every host of a slice from global step `first`, restored from checkpoint `read`: `steps` steps of its stream,
    then the layout of step `first + steps` saved to `write` (every host computes the same: the chief's is kept)."""
    seen, line = [], ""
    for worker in range(hosts):
        pipeline = mixed(files, weights, exhausted)
        mixture = MixtureState(pipeline, hosts)
        layout = ExampleLayout(pipeline, cluster(hosts, 2, worker), mixture)
        checkpoint = tf.train.Checkpoint(**{LAYOUT_KEY: layout, MIXTURE_KEY: mixture})
        if read:
            checkpoint.read(read).assert_consumed()
            line = layout.resume(first, "runs/mixed")
        context = tf.distribute.InputContext(hosts, worker, 2)
        for batch in layout.stream(context, first).take(steps * 2 // hosts):  # a batch a replica, 2 replicas
            source, ids = batch[SOURCE_KEY].numpy(), batch["id"].numpy()
            seen += [(list(SOURCES)[s], int(i)) for s, i in zip(source, ids)]
        layout.record(first + steps)
        if worker == 0:
            checkpoint.write(write)
    return seen, line


def assert_every_epoch_once(seen: list[tuple[str, int]]) -> None:
    """Each source's records m or m + 1 times, m its whole epochs read (a record doubled or dropped within an epoch
    shows as m + 2 or m - 1 beside the others)."""
    for name, count in SOURCES.items():
        ids = collections.Counter(i for source, i in seen if source == name)
        whole = sum(ids.values()) // count
        assert sorted(ids) == list(range(count)) or whole == 0, f"{name}: {count - len(ids)} record(s) never read"
        assert set(ids.values()) <= {whole, whole + 1}, (name, collections.Counter(ids.values()))


@pytest.mark.parametrize("slices", [
    [(2, 5), (1, 7), (2, 6)],  # 2 -> 1 inside the first epochs, 1 -> 2 past the dealt rest
    [(2, 3), (1, 1), (2, 8)],  # 1 -> 2 inside the dealt rest: its unread part dealt again
    [(1, 4), (2, 3), (1, 9)],  # 1 -> 2 -> 1
])
def test_a_mixture_goes_on_exactly_on_other_numbers_of_hosts(files, tmp_path, slices):
    seen, step, read = [], 0, None
    lines = []
    for number, (hosts, steps) in enumerate(slices):
        write = str(tmp_path / f"ckpt-{number}")
        part, line = segment(files, hosts, step, steps, read, write)
        seen += part
        lines.append(line)
        step, read = step + steps, write
    assert len(seen) == step * GLOBAL_BATCH
    assert_every_epoch_once(seen)
    to = "this host" if slices[1][0] == 1 else "the 2 hosts in turns"
    assert "the rest of the sources' data epochs (web 1, code 1)" in lines[1] and f"is dealt to {to}" in lines[1], lines


def test_a_mixture_that_ends_reads_each_record_once_across_three_slices(files, tmp_path):
    """Sources that end (exhausted: drop): the whole run is one epoch of each, so a record read twice or never
    shows at once; 2 hosts, then 1 inside the first epoch, then 2 again inside the dealt rest, to the end."""
    seen, step, read = [], 0, None
    for number, (hosts, steps) in enumerate([(2, 3), (1, 1), (2, 20)]):
        write = str(tmp_path / f"ckpt-{number}")
        part, _ = segment(files, hosts, step, steps, read, write, exhausted="drop")
        seen += part
        step, read = step + steps, write
    assert sorted(seen) == sorted((name, i) for name, count in SOURCES.items() for i in range(count))


def test_the_remainder_counts_what_each_old_host_had_left_of_each_source(files, tmp_path):
    """The dealt rest's length, from the schedule's closed form, is what the rebuilt old mixtures yield."""
    segment(files, 2, 0, 5, None, str(tmp_path / "two"))
    pipeline = mixed(files)
    mixture = MixtureState(pipeline, 1)
    layout = ExampleLayout(pipeline, cluster(1, 2), mixture)
    tf.train.Checkpoint(**{LAYOUT_KEY: layout, MIXTURE_KEY: mixture}).read(str(tmp_path / "two")).assert_consumed()
    line = layout.resume(5, "runs/mixed")
    remainder = layout.layout.remainder
    assert isinstance(remainder, MixedRemainder) and remainder.examples == (20, 20), line
    # 5 steps of 4 a host: ~12 web and ~8 code records of each host's 24 and 12: both in epoch 0
    assert remainder.epochs == (0, 0) and remainder.total == sum(SOURCES.values()) - 40
    dealt = list(layout.stream(tf.distribute.InputContext(1, 0, 2), 5).unbatch().take(remainder.total))
    assert len(dealt) == remainder.total
    assert layout.start_of(0, 5) == -remainder.total
    assert Layout.from_json(Layout(layout.layout.examples, 5, remainder).to_json()).remainder == remainder


def test_weights_changed_with_the_slice_are_said_and_the_dealt_rest_keeps_the_old_ones(files, tmp_path):
    seen, _ = segment(files, 2, 0, 5, None, str(tmp_path / "two"))
    pipeline = mixed(files, (0.5, 0.5))
    mixture = MixtureState(pipeline, 1)
    layout = ExampleLayout(pipeline, cluster(1, 2), mixture)
    tf.train.Checkpoint(**{LAYOUT_KEY: layout, MIXTURE_KEY: mixture}).read(str(tmp_path / "two")).assert_consumed()
    layout.resume(5, "runs/mixed")
    lines = mixture.resume(lambda context: (layout.start_of(context.input_pipeline_id, 5), 0, 0), 2)
    assert len(lines) == 1 and "web 0.6 -> 0.5" in lines[0] and "the dealt rest keeps the old ones" in lines[0], lines
    more, _ = segment(files, 1, 5, 6, str(tmp_path / "two"), str(tmp_path / "one"), weights=(0.5, 0.5))
    assert_every_epoch_once(seen + more)

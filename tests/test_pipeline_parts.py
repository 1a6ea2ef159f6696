"""A pipeline's structure is its named parts (tpu_pipeline.pipeline.stages.roles), split once from its stages
by the roles they declare: what is built once, per epoch, the repeat, the stream, and the windowed
stage, the batch, the outputs, the service split by name. Nothing else reads the list back by type."""
from __future__ import annotations

import ast
import dataclasses
import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from helpers import small_config, write_small_shards
from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import ArraySource, Pipeline
from tpu_pipeline.pipeline.sequences.sequence_stages import Bucket, PackRows
from tpu_pipeline.pipeline.stages.base import Stage, StageContext
from tpu_pipeline.pipeline.stages.batching import Batch
from tpu_pipeline.pipeline.stages.cache import Cache
from tpu_pipeline.pipeline.stages.map_features import MapFeatures
from tpu_pipeline.pipeline.stages.options import WithOptions
from tpu_pipeline.pipeline.stages.outputs import ToOutputs
from tpu_pipeline.pipeline.stages.prefetch import Prefetch
from tpu_pipeline.pipeline.stages.repeat import Repeat
from tpu_pipeline.pipeline.stages.roles import split_by_roles
from tpu_pipeline.pipeline.stages.service_split import ServiceSplit
from tpu_pipeline.pipeline.stages.shuffles import Shuffle, WindowShuffle

pytestmark = pytest.mark.tf_builds

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tpu_pipeline"
OWNER = "pipeline/stages/roles.py"  # the one module that may split stages by what they are


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> str:
    return write_small_shards(str(tmp_path_factory.mktemp("parts")), 64, 2)[0]


def from_config(files: str, **overrides) -> Pipeline:
    return Pipeline.from_config(config_from_dict({"data": small_config(files, **overrides)}).data)


def write_tokens(directory: str, num: int = 24) -> str:
    path = os.path.join(directory, "tokens.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(num):
            tokens = tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(1, 2 + i % 7))))
            writer.write(tf.train.Example(features=tf.train.Features(feature={"tokens": tokens})).SerializeToString())
    return path


# --- the split, for configs ------------------------------------------------------------------------------------

def test_a_batched_parse_config_splits_into_epoch_repeat_and_stream(files):
    parts = from_config(files, outputs={"inputs": "features", "targets": "label"}).parts
    assert parts.once == () and [type(s) for s in parts.epoch] == [WindowShuffle]
    assert isinstance(parts.repeat, Repeat) and parts.repeat.count == 1
    assert [type(s) for s in parts.stream] == [Batch, MapFeatures, ToOutputs, Prefetch, WithOptions]
    assert parts.batch is parts.stream[0] and parts.batch.records and parts.batch.global_batch_size == 64
    assert parts.outputs is parts.stream[2] and parts.outputs.targets == "label"
    assert (parts.prefetch, parts.options) == parts.stream[3:]
    assert parts.windowed is None and parts.service is None and parts.steps is None
    assert parts.stages == (*parts.once, *parts.epoch, parts.repeat, *parts.stream)


def test_a_cache_ends_what_is_built_once(files, tmp_path):
    pipeline = from_config(files, cache={"enabled": True}, shuffle={"mode": "stream", "buffer_size": 64})
    parts = pipeline.parts
    assert [type(s) for s in parts.once] == [MapFeatures, Cache]
    assert [type(s) for s in parts.epoch] == [Shuffle]
    assert list(pipeline.stages) == list(parts.stages)  # the list stays readable as it was


def test_a_pack_config_names_its_windowed_stage_and_the_batch_of_rows(tmp_path):
    data = {"source": {"type": "tfrecord", "files": write_tokens(str(tmp_path))},
            "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
            "sequence": {"keys": ["tokens"], "length": 8, "mode": "pack", "window": 8},
            "batch_size": 4, "repeat": 1, "seed": 3}
    parts = Pipeline.from_config(config_from_dict({"data": data}).data).parts
    assert isinstance(parts.windowed, PackRows)
    # The records are cut into blocks by a Batch too, but only the batch of rows makes the steps.
    blocks = [s for s in parts.stream if isinstance(s, Batch) and not s.per_replica]
    assert blocks and parts.batch is not blocks[0] and parts.batch.per_replica
    assert parts.stages.index(parts.windowed) < parts.stages.index(parts.batch)


def test_a_service_config_names_its_split_and_keeps_the_options_after_it(files):
    data = small_config(files)
    data["service"] = {"address": "grpc://10.0.0.2:5050"}  # never contacted: nothing is built here
    parts = Pipeline.from_config(config_from_dict({"data": data}).data).parts
    assert isinstance(parts.service, ServiceSplit)
    assert parts.following("service") == (parts.prefetch, parts.options)
    workers = parts.until("service")
    assert workers.service is None and workers.batch is parts.batch and workers.repeat is parts.repeat


# --- the split, for pipelines composed by hand -----------------------------------------------------------------

class Doubled(Stage):
    """A user's own stage: declares nothing, so it is a map stage wherever it stands."""

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset.map(lambda features: {**features, "x": features["x"] * 2})


@dataclasses.dataclass(frozen=True)
class PairUp(Stage):
    """A user's own outputs: declares the role, so the pipeline finds it by name (evaluation, position)."""

    roles = ("outputs",)
    targets: str = "x"
    position: bool = False
    weights: None = None

    def apply(self, dataset: tf.data.Dataset, context: StageContext) -> tf.data.Dataset:
        return dataset.map(lambda features: (features["x"], features[self.targets]))


class DuckStage:
    """No Stage subclass at all: apply and after are all a pipeline asks of a stage."""

    def apply(self, dataset, context):
        return dataset

    def after(self, context):
        return context


def test_a_users_own_stages_work_in_a_pipeline_composed_by_hand():
    doubled, duck, outputs = Doubled(), DuckStage(), PairUp()
    pipeline = Pipeline(ArraySource({"x": np.arange(8)}),
                        [doubled, Cache(), duck, Repeat(2), Batch(4), outputs, Prefetch(1)])
    parts = pipeline.parts
    assert parts.once == (doubled, parts.stages[1]) and parts.epoch == (duck,)
    assert parts.outputs is outputs and parts.batch.global_batch_size == 4
    batches = [(x.numpy().tolist(), y.numpy().tolist()) for x, y in pipeline.build()]
    assert [x for x, _ in batches] == [[0, 2, 4, 6], [8, 10, 12, 14]] * 2 and all(x == y for x, y in batches)
    # Rewrites go by name: the meter of train, evaluation's padding.
    metered = pipeline.with_stage(duck, before="outputs").parts
    assert metered.stages[metered.stages.index(outputs) - 1] is duck


def test_evaluation_rewrites_a_hand_built_pipeline_by_its_parts():
    pipeline = Pipeline(ArraySource({"x": np.arange(10), "y": np.arange(10) % 2}),
                        [Doubled(), Repeat(1), Batch(4), ToOutputs("x", "y"), Prefetch(1)])
    evaluated = pipeline.for_evaluation()
    parts = evaluated.parts
    assert parts.batch.drop_remainder is False and pipeline.parts.batch.drop_remainder is True
    assert parts.stages[parts.stages.index(parts.outputs) + 1] is parts.steps
    assert evaluated.evaluation_steps(num_replicas=1) == 3
    weights = [w.numpy().tolist() for _, _, w in evaluated.build()]
    assert weights == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]]


def test_a_pipeline_with_no_repeat_is_one_epoch_and_a_bucket_is_windowed_and_the_batch():
    bucket = Bucket(["tokens"], 8, lengths={"tokens": 8}, bucket_lengths=(4, 8), global_batch_size=4)
    parts = Pipeline(ArraySource({"x": np.arange(4)}), [Shuffle(4), bucket]).parts
    assert parts.repeat is None and parts.stream == () and parts.epoch == (parts.stages[0], bucket)
    assert parts.windowed is parts.batch is bucket
    assert parts.until("windowed", inclusive=True).stages == parts.stages and parts.following("windowed") == ()


def test_parts_are_rewritten_by_name():
    batch, outputs = Batch(4), ToOutputs("x", None)
    parts = split_by_roles([Repeat(None), batch, outputs, WithOptions(tf.data.Options()), WithOptions(tf.data.Options())])
    assert parts.options is parts.stages[-1]  # the last options, as tf.data applies them
    smaller = parts.replaced(batch=Batch(2))
    assert smaller.batch.global_batch_size == 2 and smaller.outputs is outputs and len(smaller.stages) == 5
    assert parts.inserted(Prefetch(1), before="service").stages[-1].buffer_size == 1  # no service: at the end
    assert parts.inserted(Prefetch(1), after="batch").stages[2].buffer_size == 1
    with pytest.raises(KeyError, match="windowed"):
        parts.replaced(windowed=batch)


def test_roles_are_checked_and_what_is_not_a_stage_is_refused():
    class Odd(Stage):
        roles = ("batches",)

    with pytest.raises(ValueError, match=r"unknown stage roles \['batches'\]"):
        split_by_roles([Odd()])
    with pytest.raises(TypeError, match="is not a stage"):
        Pipeline(ArraySource({"x": np.arange(4)}), [lambda dataset: dataset])


# --- nothing reads a pipeline's stages back by type -------------------------------------------------------------

def stage_classes(root: pathlib.Path) -> set[str]:
    """The names of every Stage subclass the package defines (by its class statements)."""
    bases: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, set()).update(
                    base.id if isinstance(base, ast.Name) else base.attr
                    for base in node.bases if isinstance(base, (ast.Name, ast.Attribute)))
    found = {"Stage"}
    while True:
        more = {name for name, of in bases.items() if of & found} - found
        if not more:
            return found
        found |= more


def type_reads(source: str, classes: set[str]) -> list[int]:
    """Lines of `source` where isinstance/issubclass asks whether something is one of `classes`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            names = {k.id if isinstance(k, ast.Name) else k.attr for k in kinds if isinstance(k, (ast.Name, ast.Attribute))}
            if names & classes:
                lines.append(node.lineno)
    return lines


def test_no_module_reads_stages_back_by_type():
    classes = stage_classes(PACKAGE)
    assert {"Batch", "Repeat", "Cache", "ToOutputs", "Windowed", "Bucket", "ServiceSplit", "PadToSteps"} <= classes
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == OWNER:
            continue
        text = path.read_text()
        found += [f"{relative}:{line}: {text.splitlines()[line - 1].strip()}" for line in type_reads(text, classes)]
    assert not found, "ask the pipeline's parts by name (pipeline.parts.batch, .outputs, ...) instead:\n" + "\n".join(found)


def test_the_planted_type_read_is_found():
    classes = {"Stage", "Batch", "ToOutputs"}
    assert type_reads("batches = [s for s in stages if isinstance(s, Batch)]", classes) == [1]
    assert type_reads("x = 1\nif isinstance(stage, (stages.ToOutputs, int)):\n    pass", classes) == [2]
    assert type_reads("if isinstance(key, str) or isinstance(spec, tf.TensorSpec): pass", classes) == []

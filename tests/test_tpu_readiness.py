"""What a TPU needs, checked where it can be (on CPU, under the plain and the TPU TensorFlow alike).

- The TPU check (`target="tpu"`: static shapes, TPU dtypes) passes on every shipped config that trains:
  configs/demo.yaml, the built-in demo config, configs/image_folder.yaml, configs/imagenet_resnet.yaml,
  configs/imagenet_vit.yaml (RandAugment, random erasing, mixup and CutMix), configs/text_lm.yaml, configs/text_lm_mixture.yaml and configs/chat_sft.yaml, each on small data of the kind it reads, for the
  training stream and for one whole pass of the exact evaluation, as an 8-replica strategy distributes them.
  (The exact evaluation of packed rows and of a mixture once failed here: its unpadded counting pass ran
  the check.)
- The train job as it runs on a TPU (`train` with a cluster of kind "tpu": the pipelines built with
  `target="tpu"`, the model with mixed_bfloat16 and steps_per_execution 'auto'), over the conftest's
  8-replica CPU MirroredStrategy in place of a TPUStrategy, for the image demo and the packed text LM:
  every batch of every replica has the one static shape its distributed dataset declares, the model
  computes in bfloat16 with float32 variables and logits, several steps run per execution, and the loss
  is finite.

Covered elsewhere, not repeated here: the TPU check's rules and messages (test_pipeline.py,
test_sequence_efficiency.py), precision and steps_per_execution resolution and a kind="tpu" build on one
replica (test_model.py), 8-replica float32 fits with steps_per_execution 4 (test_model.py, test_train.py),
bfloat16 Transformer logits (test_transformer.py).
"""
from __future__ import annotations

import itertools
import math
import os
from typing import Optional

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.cluster.resolver import ClusterInfo
from tpu_pipeline.config import load_config
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
from tpu_pipeline.records import ConvertOptions, convert, ensure_demo_dataset
from tpu_pipeline.records.demo_chat import ensure_chat_demo
from tpu_pipeline.records.image_folder import ImageFolderSource
from tpu_pipeline.records.text_input import TextSource
from tpu_pipeline.records.writer import bytes_feature, int_feature, write_split
from tpu_pipeline.train.runner import _training_data

from test_convert import FAST, make_image_folder
from test_text_lm import write_corpus

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(REPO, "configs")
REPLICAS = 8


# --- small data where each shipped config reads ---------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """Small data sets of each kind the shipped configs read: the shapes demo (as the demo writes it), a
    converted image folder, ImageNet-style records, and two byte-level text corpora (as `convert --from text`
    writes them)."""
    root = tmp_path_factory.mktemp("tpu_readiness")
    demo_cache = str(root / "cache")
    shapes = ensure_demo_dataset(demo_cache, num_train=512, num_eval=128, size=32, num_shards=8)
    make_image_folder(root / "images", per_class=8)
    flowers = str(root / "flowers")
    convert(ImageFolderSource(str(root / "images"), splits="train=0.75,validation=0.25", seed=1), flowers,
            ConvertOptions(min_shards=2, **FAST))
    imagenet = str(root / "imagenet")
    for split, count in (("train", 64), ("validation", 40)):
        write_split(imagenet_examples(count), imagenet, split, 2)
    corpora = {}
    for name, seed in (("docs", 0), ("code", 1)):
        text = write_corpus(root / f"{name}_text", 300, seed=seed)
        corpora[name] = str(root / name)
        convert(TextSource([text], splits="train=0.9,validation=0.1", text_field="text"), corpora[name],
                ConvertOptions(min_shards=2, progress=False))
    chat = ensure_chat_demo(out_dir=str(root / "chat"), limit=150)  # the chat demo's first pairs, converted
    return {"demo_cache": demo_cache, "shapes": shapes, "flowers": flowers, "imagenet": imagenet, "chat": chat, **corpora}


def imagenet_examples(count: int):
    """Serialized tf.Examples as the classic imagenet_to_gcs script writes them (the keys
    configs/imagenet_resnet.yaml reads): JPEG bytes under image/encoded, a 0-based image/class/label."""
    rng = np.random.default_rng(count)
    for index in range(count):
        pixels = rng.integers(0, 256, size=(40 + index % 7, 48, 3), dtype=np.uint8)
        feature = {"image/encoded": bytes_feature(tf.io.encode_jpeg(pixels).numpy()),
                   "image/class/label": int_feature(index % 10)}
        yield tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def shipped(name: str, data: dict[str, str], extra: tuple[str, ...] = ()):
    """The shipped config `name`, its data sources pointed at the small sets, plus `extra` overrides."""
    if name == "builtin demo":  # `tpu-pipeline demo`'s config, through its own helper
        from tpu_pipeline.demo import demo_config

        return demo_config(list(extra), cache_dir=data["demo_cache"], num_train=512, num_eval=128, size=32,
                           num_shards=8)
    sections = ("data", "eval_data")
    if name in ("imagenet_resnet", "imagenet_vit"):  # gs://YOUR_BUCKET/imagenet/...: a small set, 8 per replica
        overrides = [f"{section}.source.files={data['imagenet']}/{split}-*" for section, split in
                     zip(sections, ("train", "validation"))] + [f"{section}.batch_size=64" for section in sections]
    elif name == "text_lm_mixture":
        overrides = [f"{section}.mixture.sources.{index}.source.dir={data[source]}"
                     for section in sections for index, source in enumerate(("docs", "code"))]
    else:
        directory = {"demo": data["shapes"], "image_folder": data["flowers"], "text_lm": data["docs"],
                     "chat_sft": data["chat"]}[name]
        overrides = [f"{section}.source.dir={directory}" for section in sections]
    return load_config(os.path.join(CONFIGS, f"{name}.yaml"), overrides + list(extra))


# --- what a distributed dataset holds -------------------------------------------------------------


def static_shapes(distributed, steps: Optional[int] = None) -> set[tuple[tuple[int, ...], str]]:
    """The (shape, dtype) each replica's batches declare, after checking that every leaf of the distributed
    dataset's element_spec is dense with a fully defined shape, the same on all 8 replicas, and that each of
    the first `steps` batches (None: every batch, for a finite dataset) of every replica has exactly it."""
    specs = []
    for spec in tf.nest.flatten(distributed.element_spec):  # a PerReplicaSpec per leaf: one spec per replica
        replicas = getattr(spec, "_value_specs", None)
        assert replicas is not None and len(replicas) == REPLICAS, spec
        assert all(isinstance(r, tf.TensorSpec) for r in replicas), spec  # dense: nothing ragged or sparse
        assert replicas[0].shape.is_fully_defined(), f"a dynamic dimension reaches the replicas: {spec}"
        assert len(set(replicas)) == 1, f"the replicas' batches differ in shape: {spec}"
        specs.append(replicas[0])
    batches = 0
    for element in itertools.islice(distributed, steps):
        values = tf.nest.flatten(element)  # a PerReplica per leaf
        assert len(values) == len(specs), (element, specs)
        for value, spec in zip(values, specs):
            assert len(value.values) == REPLICAS, value
            for tensor in value.values:
                assert (tensor.shape, tensor.dtype) == (spec.shape, spec.dtype), (tensor.shape, tensor.dtype, spec)
        batches += 1
    assert batches == steps if steps is not None else batches > 0, batches
    return {(tuple(spec.shape.as_list()), spec.dtype.name) for spec in specs}


# --- (a) the TPU check on every shipped config that trains ----------------------------------------


SHIPPED = ["demo", "builtin demo", "image_folder", "imagenet_resnet", "imagenet_vit", "text_lm", "text_lm_mixture",
           "chat_sft"]


def test_every_config_in_configs_is_checked():
    """A config added to configs/ joins SHIPPED (and `shipped` learns where its data goes)."""
    names = sorted(os.path.splitext(name)[0] for name in os.listdir(CONFIGS) if name.endswith(".yaml"))
    assert names == sorted(set(SHIPPED) - {"builtin demo"}), names


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_passes_the_tpu_check_on_eight_replicas(name, data, eight_replica_strategy):
    """The pipelines `train` builds on a TPU (`target="tpu"`), training stream and exact evaluation, each
    built by the strategy for 8 replicas: the TPU check runs in `build` and raises on any problem."""
    config = shipped(name, data)
    vocab = config_vocabulary(config)
    pipeline = Pipeline.from_config(_training_data(config), target="tpu", num_classes=config.train.num_classes,
                                    vocab=vocab)
    assert pipeline.check_tpu
    static_shapes(pipeline.distribute(eight_replica_strategy), steps=1)
    assert config.eval_data is not None, f"configs/{name}.yaml: no eval_data"
    evaluation = Pipeline.from_config(config.eval_data, target="tpu", prefix="eval_data",
                                      num_classes=config.train.num_classes, vocab=vocab).for_evaluation()
    assert evaluation.check_tpu
    static_shapes(evaluation.distribute(eight_replica_strategy))  # one whole pass: its last batch padded


# --- (b) the train job as on a TPU, over 8 CPU replicas -------------------------------------------


def as_tpu(strategy: tf.distribute.Strategy) -> ClusterInfo:
    """What the resolver returns on a one-host TPU, with the 8-replica CPU strategy in TPUStrategy's place."""
    return ClusterInfo(strategy=strategy, kind="tpu", num_replicas=strategy.num_replicas_in_sync, num_hosts=1,
                       devices=tuple(strategy.extended.worker_devices), tpu="local",
                       source="a test: 8 CPU replicas standing in for a TPU")


def train_as_on_tpu(config, strategy, monkeypatch):
    """`train(config)` on a cluster of kind 'tpu'; returns its metrics, the model it built and the
    distributed datasets it made: the exact evaluation's (made first) and the training stream's."""
    from tpu_pipeline.train import runner

    built, distributed = [], []
    build_model = runner.build_model
    distribute = strategy.distribute_datasets_from_function

    def building(*args, **kwargs):
        built.append(build_model(*args, **kwargs))
        return built[-1]

    def distributing(*args, **kwargs):
        distributed.append(distribute(*args, **kwargs))
        return distributed[-1]

    monkeypatch.setattr(runner, "build_model", building)
    monkeypatch.setattr(strategy, "distribute_datasets_from_function", distributing)
    metrics = runner.train(config, cluster=as_tpu(strategy), printer=lambda line: None)
    monkeypatch.undo()
    assert len(built) == 1 and len(distributed) == 2, (built, distributed)  # one fit from step 0: one stream
    return metrics, built[0], distributed


def check_trained_as_on_tpu(metrics: dict, model, steps: int) -> None:
    assert metrics["cluster"] == {"kind": "tpu", "replicas": REPLICAS, "hosts": 1}
    assert metrics["steps"] == steps
    # steps_per_execution 'auto' on a TPU: 32, at most an epoch's steps; more than one step per execution
    assert int(model._steps_per_execution.numpy()) == min(32, metrics["steps_per_epoch"]) > 1
    # mixed_bfloat16, as the TPU path sets it: bfloat16 compute, float32 variables and logits
    assert model.dtype_policy.name == "mixed_bfloat16"
    computing = [layer for layer in model.layers if layer.weights and layer.name != "logits"]
    assert computing and all(layer.compute_dtype == "bfloat16" for layer in computing), [
        (layer.name, layer.compute_dtype) for layer in computing]
    assert all(v.dtype == tf.float32 for v in model.trainable_variables)
    assert model.get_layer("logits").compute_dtype == "float32"
    losses = metrics["history"]["loss"] + [metrics["eval_loss"]]
    assert all(math.isfinite(loss) for loss in losses), metrics["history"]


def test_the_image_demo_trains_as_on_a_tpu(data, eight_replica_strategy, tmp_path, monkeypatch):
    config = shipped("demo", data, (
        "data.preprocess.1.size=32", "eval_data.preprocess.1.size=32", "data.batch_size=64", "eval_data.batch_size=80",
        "model.cnn.filters=[8, 16]", "model.schedule.warmup_epochs=0.25", "train.epochs=1",
        f"train.run_dir={tmp_path / 'run'}", "train.tensorboard=false",
    ))
    metrics, model, (evaluation, training) = train_as_on_tpu(config, eight_replica_strategy, monkeypatch)
    check_trained_as_on_tpu(metrics, model, steps=512 // 64)
    train_shapes = static_shapes(training, steps=3)
    assert train_shapes == {((8, 32, 32, 3), "float32"), ((8,), "int32")}, train_shapes
    # the exact evaluation: 128 examples in 2 steps of 80, the last padded to the same shape
    assert static_shapes(evaluation) == {((10, 32, 32, 3), "float32"), ((10,), "int32"), ((10,), "float32")}


@pytest.mark.slow  # ~45 s of CPU: tracing a Transformer's step on 8 replicas
def test_the_packed_text_lm_trains_as_on_a_tpu(data, eight_replica_strategy, tmp_path, monkeypatch):
    config = shipped("text_lm", data, (
        "data.sequence.length=128", "model.transformer={width: 32, depth: 1, heads: 2, mlp_dim: 64}",
        "train.epochs=1", "train.steps_per_epoch=4", f"train.run_dir={tmp_path / 'run'}",
        "train.tensorboard=false",
    ))
    assert config.data.sequence.mode == "pack"
    metrics, model, (evaluation, training) = train_as_on_tpu(config, eight_replica_strategy, monkeypatch)
    check_trained_as_on_tpu(metrics, model, steps=4)
    train_shapes = static_shapes(training, steps=3)
    rows = 16 // REPLICAS
    assert {shape for shape, _ in train_shapes} == {(rows, 128)}, train_shapes
    assert {dtype for _, dtype in train_shapes} <= {"int32", "float32"}, train_shapes
    static_shapes(evaluation)

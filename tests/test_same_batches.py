"""The same configs give the same batches, bit for bit: a guard for refactors that must not change behaviour.

Why: issue 26 splits the pipeline builder into modules, gives stages one interface and makes sequence
modes objects. Every other test checks properties (each example once, exact resume, static shapes); a
refactor can keep all of them and still change which examples a batch holds, a seed, or a value. This
test pins the batches themselves: for a few small configs of each kind (images with decode,
augmentation, shuffle and repeat over two input pipelines; tokens in pad, bucket and pack mode with
language-model outputs; exact evaluation; a resumed iterator), built through the public path
(`config_from_dict` → `Pipeline.from_config` → `build` per `tf.distribute.InputContext`, `for_evaluation`,
`iterator` restored from a `tf.train.Checkpoint`), it hashes the first batches (sha256 over each
output's path, dtype, shape and bytes, in sorted key order) and compares with a constant recorded
from commit 64fd0d8, before the refactor. The data is written in a tmp dir from fixed seeds; nothing
of its path enters a hash.

The hashes depend on TensorFlow (JPEG codec, stateless random ops): they were recorded with
`RECORDED_TF_VERSIONS` (2.21, and the TPU build 2.19.1 gives the same) and the test skips on another major.minor.

Re-record only when a change of behaviour is intended (or TensorFlow's version moves), and say which
and why in the commit: set `RECORDED_TF_VERSIONS`, run
`python -m pytest -q tests/test_same_batches.py` on the commit whose batches are right, and copy each
failure's `got` digest into `EXPECTED`. A digest that changed without an intended change is a bug.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Callable, Iterable

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.testing import write_tfrecords

pytestmark = pytest.mark.tf_builds

# major.minor of the TensorFlows that give EXPECTED: recorded with 2.21; the TPU build 2.19.1 (.venv-tpu, whose
# packer places rows without XLA) gives the same bytes, so a run resumed across the two continues exactly.
RECORDED_TF_VERSIONS = ("2.21", "2.19")

if ".".join(tf.__version__.split(".")[:2]) not in RECORDED_TF_VERSIONS:
    pytest.skip(f"batch hashes were checked with TensorFlow {' and '.join(RECORDED_TF_VERSIONS)}, this is "
                f"{tf.__version__}", allow_module_level=True)

# sha256 of the batches each config gives (see batches_digest); recorded from commit 64fd0d8.
EXPECTED: dict[str, str] = {
    "image_train_pipeline_0": "bc20f11498691b26c985bd8d98e77c80577c4317e90536fd8efd511a852800ff",
    "image_train_pipeline_1": "96b4c8f683968293b615f732723f8b0b8390e20b893f61805e2a36b3a0da628b",
    "image_resumed_mid_epoch": "54ccb6b411d1787d83643c2a61bcd0a78505a2547bdce8ef02b81b291a398b0c",
    "image_evaluation": "a9f988a4171613caf4cd9d43e80551ae3aa275ffb099e436a8637ff96ece33de",
    "pad_language_model": "ad1d0837b5f72746c0bf3c6de7e0a02f15a59c4cf7d626ed9d0066d3fde28735",
    "bucket_pipeline_0": "c97e10d4dcd627417fe557db63c4d2265f33745e8d88e936dc49b4b46ab61e3a",
    "bucket_pipeline_1": "85b5747423a5c9e0f8f32e1a29219d328fbf1cec1970e3413181eaafa76cc42b",
    "pack_language_model": "bf93a5d6a7c7ae9cf9e64c55754d89bd4ca3d32ab962960d3738c4e717e0109e",
    "pack_resumed": "80e0f2498d27498adb546908c68b7475bd6a761f209ef9e330211f69507db10f",
    "pack_evaluation": "79b861bba8bfacb345581b5fcf63c534884d98751b0d0af5fb846eb7136cc515",
}

TAKE = 6  # batches hashed of an endless or long stream
NUM_IMAGES = 64
NUM_DOCUMENTS = 96
LENGTH = 32


# --- data, from fixed seeds ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> str:
    features = {"image": {"dtype": "string"}, "label": {"dtype": "int64"}}
    return write_tfrecords(tmp_path_factory.mktemp("images"), features, num=NUM_IMAGES, num_shards=4, seed=0,
                           image_size=20)


@pytest.fixture(scope="module")
def token_files(tmp_path_factory) -> str:
    """tf.Examples {tokens: int64 list of 1 to 2.5 x LENGTH ids in [0, 256), id}, example i in file i % 3."""
    directory = str(tmp_path_factory.mktemp("tokens"))
    rng = np.random.default_rng(7)
    writers = [tf.io.TFRecordWriter(os.path.join(directory, f"tokens-{f}.tfrecord")) for f in range(3)]
    for index in range(NUM_DOCUMENTS):
        tokens = rng.integers(0, 256, size=int(rng.integers(1, 5 * LENGTH // 2))).tolist()
        feature = {"tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                   "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[index]))}
        writers[index % 3].write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    for writer in writers:
        writer.close()
    return os.path.join(directory, "tokens-*.tfrecord")


# --- configs, as a user writes them --------------------------------------------------------------------------------

def image_section(files: str, evaluation: bool = False) -> dict:
    """Decode and random crop, flip, bfloat16; shuffled, two epochs (evaluation: center crop, one pass)."""
    crop = {"op": "decode_and_center_crop_jpeg" if evaluation else "decode_and_random_crop_jpeg", "size": 12}
    section = {
        "source": {"type": "tfrecord", "files": files, "cycle_length": 2, "deterministic": True},
        "features": {"image": {"dtype": "string"}, "label": {"dtype": "int64"}, "id": {"dtype": "int64"}},
        "preprocess": [{"op": "cast", "key": "label", "dtype": "int32"}],
        "augment": [crop, *([] if evaluation else [{"op": "random_flip"}]),
                    {"op": "cast", "key": "image", "dtype": "bfloat16"}],
        "shuffle": {"enabled": False} if evaluation else {"buffer_size": 32},
        "repeat": 1 if evaluation else 2,
        "batch_size": 12 if evaluation else 8,
        "seed": 5,
        "options": {"deterministic": True},
    }
    if evaluation:
        section["outputs"] = {"inputs": "image", "targets": "label"}
    return section


def image_config(files: str, evaluation: bool = False):
    return config_from_dict({"data": image_section(files, evaluation)}).data


def token_section(files: str, mode: str, evaluation: bool = False) -> dict:
    """Language-model sections as configs/text_lm.yaml has them (lm_shift, outputs derived from the
    mode); bucket mode reads tokens and id with no outputs."""
    language_model = mode != "bucket"
    section = {
        "source": {"type": "tfrecord", "files": files, "deterministic": True},
        "features": {"tokens": {"dtype": "int64", "kind": "ragged"}},
        "shuffle": {"enabled": False} if evaluation else {"buffer_size": 64},
        "repeat": 1 if evaluation or mode == "bucket" else "forever" if mode == "pack" else 2,
        "batch_size": 8,
        "seed": 3,
        "options": {"deterministic": True},
    }
    if language_model:
        section["preprocess"] = [{"op": "lm_shift", "key": "tokens"}]
    if evaluation:
        return section  # its sequence follows data's
    if language_model:
        section["sequence"] = {"keys": ["inputs", "targets"], "length": LENGTH, "mode": mode}
    else:
        section["features"]["id"] = {"dtype": "int64"}
        section["sequence"] = {"keys": ["tokens"], "length": LENGTH, "mode": mode, "window": 16}
    if mode == "pack":
        section["sequence"].update(overflow="split", window=16, row_shuffle=2)
    return section


def token_config(files: str, mode: str):
    raw = {"data": token_section(files, mode), "train": {"task": "language_model"}}
    if mode == "pack":
        raw["eval_data"] = token_section(files, mode, evaluation=True)
    return config_from_dict(raw)


# --- hashing -------------------------------------------------------------------------------------------------------

def flat_outputs(element: Any, path: str = "") -> Iterable[tuple[str, tf.Tensor]]:
    """(path, tensor) of each output of an element: dict keys sorted, tuple members by index."""
    if isinstance(element, dict):
        for key in sorted(element):
            yield from flat_outputs(element[key], f"{path}/{key}")
    elif isinstance(element, (tuple, list)):
        for index, member in enumerate(element):
            yield from flat_outputs(member, f"{path}/{index}")
    else:
        yield path, element


def batches_digest(batches: Iterable[Any]) -> str:
    """sha256 over each batch's outputs (path, dtype, shape, bytes), batch after batch."""
    digest = hashlib.sha256()
    count = 0
    for batch in batches:
        count += 1
        for path, tensor in flat_outputs(batch):
            value = np.asarray(tensor.numpy())
            digest.update(f"{count}:{path}:{tensor.dtype.name}:{list(value.shape)}:".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    assert count, "the pipeline gave no batch"
    return digest.hexdigest()


def first(dataset: Iterable[Any], count: int = TAKE) -> list[Any]:
    out = []
    for element in dataset:
        out.append(element)
        if len(out) == count:
            break
    return out


def resumed(pipeline: Pipeline, context: tf.distribute.InputContext, after: int, directory) -> list[Any]:
    """The first batches of an iterator restored from a checkpoint of one that delivered `after` batches."""
    iterator = pipeline.iterator(context)
    for _ in range(after):
        next(iterator)
    path = tf.train.Checkpoint(data=iterator).write(str(directory / f"after-{after}"))
    restored = pipeline.iterator(context)
    tf.train.Checkpoint(data=restored).read(path).assert_consumed()
    return first(restored)


# --- what each hash is of ------------------------------------------------------------------------------------------

def context(pipelines: int, index: int, replicas: int) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(pipelines, index, replicas)


def image_train(index: int) -> Callable[..., list[Any]]:
    return lambda images, tokens, tmp: first(Pipeline.from_config(image_config(images)).build(context(2, index, 2)))


def image_evaluation(images: str, tokens: str, tmp) -> list[Any]:
    """Both input pipelines of 2 x 4 replicas (3 images a replica), every image once, the rest padding."""
    pipeline = Pipeline.from_config(image_config(images, evaluation=True)).for_evaluation()
    return [batch for index in range(2) for batch in pipeline.build(context(2, index, 4))]


def bucket(index: int) -> Callable[..., list[Any]]:
    return lambda images, tokens, tmp: first(
        Pipeline.from_config(token_config(tokens, "bucket").data).build(context(2, index, 4)), 2 * TAKE)


def pack_evaluation(images: str, tokens: str, tmp) -> list[Any]:
    pipeline = Pipeline.from_config(token_config(tokens, "pack").eval_data, prefix="eval_data").for_evaluation()
    return [batch for index in range(2) for batch in pipeline.build(context(2, index, 4))]


BATCHES: dict[str, Callable[..., list[Any]]] = {
    "image_train_pipeline_0": image_train(0),
    "image_train_pipeline_1": image_train(1),
    # 32 images a pipeline, 4 a batch: batch 5 is mid epoch 1, the 6 after it reach into epoch 2
    "image_resumed_mid_epoch": lambda images, tokens, tmp: resumed(
        Pipeline.from_config(image_config(images)), context(2, 1, 2), 5, tmp),
    "image_evaluation": image_evaluation,
    "pad_language_model": lambda images, tokens, tmp: first(
        Pipeline.from_config(token_config(tokens, "pad").data).build(context(1, 0, 1))),
    "bucket_pipeline_0": bucket(0),
    "bucket_pipeline_1": bucket(1),
    "pack_language_model": lambda images, tokens, tmp: first(
        Pipeline.from_config(token_config(tokens, "pack").data).build(context(1, 0, 1))),
    "pack_resumed": lambda images, tokens, tmp: resumed(
        Pipeline.from_config(token_config(tokens, "pack").data), context(1, 0, 1), 3, tmp),
    "pack_evaluation": pack_evaluation,
}


def test_every_recorded_config_is_built():
    assert sorted(BATCHES) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_same_config_gives_the_same_batches(name, image_files, token_files, tmp_path):
    got = batches_digest(BATCHES[name](image_files, token_files, tmp_path))
    assert got == EXPECTED[name], (
        f"{name}: the batches changed (got {got}, recorded {EXPECTED[name]}); if intended, re-record as the "
        "module docstring says")

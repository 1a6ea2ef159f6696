"""TFDS as a pipeline source (under tfds.testing.mock_data, and on a real tiny prepared dataset) and as
a conversion source (`--from tfds`)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.pipeline import Pipeline, TFDSSource, make_parser, source_from_config
from tpu_pipeline.format import dir_features
from tpu_pipeline.records import ConvertOptions, convert
from tpu_pipeline.records.tfds_reader import TFDSConvertSource

pytestmark = pytest.mark.tf_builds

NAMES = ["circle", "square", "triangle"]


class TinyShapes(tfds.core.GeneratorBasedBuilder):
    """A real TFDS dataset (PNG images, class labels, text, a float), prepared into a temp data_dir."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(names=NAMES),
                "name": tfds.features.Text(),
                "score": tfds.features.Scalar(dtype=np.float32),
            }),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(40, 0), "test": self._generate_examples(12, 1)}

    def _generate_examples(self, num, seed):
        rng = np.random.default_rng(seed)
        for i in range(num):
            pixels = rng.integers(0, 256, size=(8 + i % 3, 9, 3), dtype=np.uint8)
            yield i, {"image": pixels, "label": i % 3, "name": f"s{seed}-{i}", "score": float(i) / 4}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("tfds"))
    TinyShapes(data_dir=path).download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
    return path


def data_config(source: dict, **overrides) -> object:
    data = {"source": {"type": "tfds", **source}, "shuffle": {"enabled": False}, "batch_size": 8, "drop_remainder": False}
    data.update(overrides)
    return config_from_dict({"data": data}).data


def test_mock_mnist_as_supervised_composes_with_the_usual_stages():
    with tfds.testing.mock_data(num_examples=32):
        config = data_config(
            {"name": "mnist", "split": "train", "as_supervised": True},
            preprocess=[{"op": "resize", "size": 16}, {"op": "cast", "key": "label", "dtype": "int32"}],
            shuffle={"buffer_size": 32}, outputs={"inputs": "image", "targets": "label"},
            drop_remainder=True,
        )
        dataset = Pipeline.from_config(config, target="tpu").build()
        images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
    assert [i.shape for i in images] == [(8, 16, 16, 1)] * 4
    assert all(l.dtype == np.int32 and l.min() >= 0 and l.max() < 10 for l in labels)
    info = source_from_config(config).info()
    assert info.class_names == [str(i) for i in range(10)]


def test_mock_feature_mapping_and_skip_decoding_give_bytes_to_the_decode_ops():
    with tfds.testing.mock_data(num_examples=8):
        config = data_config(
            {"name": "mnist", "features": {"pixels": "image", "digit": "label"}, "skip_decoding": ["image"]},
            preprocess=[{"op": "decode_image", "key": "pixels", "channels": 1}, {"op": "resize", "key": "pixels", "size": 20}],
        )
        source = Pipeline.from_config(config).source
        assert isinstance(source, TFDSSource) and source.skip_decoding == ("image",)
        raw = source.build(tf.distribute.InputContext())
        assert raw.element_spec["pixels"].dtype == tf.string and set(raw.element_spec) == {"pixels", "digit"}
        batch = next(iter(Pipeline.from_config(config).build()))
    assert batch["pixels"].shape == (8, 20, 20, 1) and batch["digit"].shape == (8,)


def test_config_errors():
    with pytest.raises(ConfigError, match="as_supervised and features"):
        data_config({"name": "mnist", "as_supervised": True, "features": {"x": "image"}})
    with pytest.raises(ConfigError, match="nothing to parse"):
        data_config({"name": "mnist"}, features={"image": {"dtype": "string"}})
    with pytest.raises(ConfigError, match="data.source.interleave_cycle_lenght: unknown key"):
        data_config({"name": "mnist", "interleave_cycle_lenght": 4})
    with tfds.testing.mock_data(num_examples=4):
        with pytest.raises(DataError, match=r"skip_decoding: \['pixels'\] are not features of mnist"):
            Pipeline.from_config(data_config({"name": "mnist", "skip_decoding": ["pixels"]})).build()


def test_unordered_element_sharding_of_a_tfds_split_is_refused(data_dir):
    config = data_config({"name": "tiny_shapes", "data_dir": data_dir, "interleave_cycle_length": 2},
                         preprocess=[{"op": "resize", "size": 8}], options={"deterministic": False})
    assert Pipeline.from_config(config).source.read.deterministic is False
    with pytest.raises(ConfigError, match=r"data.options.deterministic=false: tiny_shapes split 'train' is sharded by "
                                          r"element between 8 input pipelines.*at least 8 files"):
        Pipeline.from_config(config).build(tf.distribute.InputContext(8, 0, 8))
    assert names_of(Pipeline.from_config(config).build())  # one pipeline: nothing to keep disjoint


def test_missing_or_unprepared_datasets_are_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="'no_such_dataset_xyz' not found"):
        Pipeline.from_config(data_config({"name": "no_such_dataset_xyz", "data_dir": str(tmp_path)})).build()
    with pytest.raises(DataError, match="not prepared in data.source.data_dir"):
        Pipeline.from_config(data_config({"name": "tiny_shapes", "data_dir": str(tmp_path)})).build()


def names_of(dataset: tf.data.Dataset) -> list[bytes]:
    return [n for batch in dataset for n in batch["name"].numpy().tolist()]


@pytest.mark.parametrize("pipelines, mode", [(2, "file"), (8, "element")])
def test_per_host_sharding_on_a_prepared_dataset(data_dir, caplog, pipelines, mode):
    config = data_config({"name": "tiny_shapes", "data_dir": data_dir, "interleave_cycle_length": 2},
                         preprocess=[{"op": "resize", "size": 8}])
    per_pipeline = [names_of(Pipeline.from_config(config).build(tf.distribute.InputContext(pipelines, i, pipelines)))
                    for i in range(pipelines)]
    everything = [n for names in per_pipeline for n in names]
    assert sorted(everything) == sorted(f"s0-{i}".encode() for i in range(40))  # each example exactly once
    assert ("sharding by element" in caplog.text) == (mode == "element")
    # The seeded file shuffle gives the same order on every build (what keeps hosts disjoint).
    again = names_of(Pipeline.from_config(config).build(tf.distribute.InputContext(pipelines, 0, pipelines)))
    assert again == per_pipeline[0]


def test_dataset_info_of_a_prepared_dataset(data_dir):
    info = source_from_config(data_config({"name": "tiny_shapes", "data_dir": data_dir, "split": "train[:25%]"})).info()
    assert info.num_examples == 10 and info.class_names == NAMES and set(info.features) == {"image", "label", "name", "score"}


def test_convert_from_tfds_round_trip(data_dir, tmp_path):
    source = TFDSConvertSource("tiny_shapes", data_dir, splits="train,validation=test")
    out = str(tmp_path / "out")
    metadata = convert(source, out, ConvertOptions(min_shards=3, progress=False)).metadata
    assert metadata["class_names"] == NAMES
    assert {s: e["num_examples"] for s, e in metadata["splits"].items()} == {"train": 40, "validation": 12}
    assert set(metadata["features"]) == {"image", "height", "width", "label", "label_name", "name", "score"}
    builder = tfds.builder("tiny_shapes", data_dir=data_dir)
    for split, tfds_split in (("train", "train"), ("validation", "test")):
        originals = {ex["name"]: ex for ex in tfds.as_numpy(builder.as_dataset(
            split=tfds_split, decoders={"image": tfds.decode.SkipDecoding()}))}
        files = [os.path.join(out, name) for name in metadata["splits"][split]["files"]]
        parse = make_parser(dir_features(out))
        converted = [{k: v.numpy() for k, v in parse(r).items()} for r in tf.data.TFRecordDataset(files)]
        assert sorted(c["name"] for c in converted) == sorted(originals)
        for example in converted:
            original = originals[example["name"]]
            assert example["image"] == original["image"]  # the PNG bytes TFDS stored
            pixels = tf.io.decode_png(example["image"]).numpy()
            assert (example["height"], example["width"]) == pixels.shape[:2]
            assert example["label"] == original["label"] and example["label_name"].decode() == NAMES[original["label"]]
            assert example["score"] == pytest.approx(original["score"])
    # The converted directory reads like any other: decoded images through the usual ops.
    config = config_from_dict({"data": {"source": {"type": "tfrecord", "dir": out, "split": "validation"},
                                        "preprocess": [{"op": "decode_image"}, {"op": "resize", "size": 8}],
                                        "shuffle": {"enabled": False}, "batch_size": 4}}).data
    assert [b["image"].shape for b in Pipeline.from_config(config).build()] == [(4, 8, 8, 3)] * 3


def test_convert_from_tfds_errors(data_dir, tmp_path):
    with pytest.raises(ConfigError, match="'validation' is not a split of tiny_shapes"):
        TFDSConvertSource("tiny_shapes", data_dir, splits="validation")
    with pytest.raises(ConfigError, match=r"--features: \['pixels'\]"):
        TFDSConvertSource("tiny_shapes", data_dir, features=["pixels"])
    with pytest.raises(DataError, match="not prepared"):
        TFDSConvertSource("tiny_shapes", str(tmp_path))
    only = TFDSConvertSource("tiny_shapes", data_dir, splits="train", features=["image", "label"])
    assert set(only.features()) == {"image", "height", "width", "label", "label_name"}


def test_convert_command_from_tfds(data_dir, tmp_path):
    """The CLI in a fresh process: TFDS finds the prepared dataset by name in --data_dir alone."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "out")
    result = subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", "convert", "--from", "tfds", "tiny_shapes", "--data_dir", data_dir,
         "--out", out, "--splits", "train=train[:30],validation=train[30:]", "--features", "image,label",
         "--min_shards", "2", "--compression", "gzip", "--noprogress"],
        cwd=repo, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: 30 examples in 2 shard(s)" in result.stdout and "validation: 10 examples in 2 shard(s)" in result.stdout
    info = source_from_config(config_from_dict({"data": {"source": {"type": "tfrecord", "dir": out, "split": "validation"},
                                                                 "batch_size": 2}}).data).info()
    assert info.num_examples == 10 and info.class_names == NAMES
    assert set(info.features) == {"image", "height", "width", "label", "label_name"}

"""The README's image-folder walk: a folder of JPEGs and PNGs → convert → a config with only
`image_size` → train and an exact evaluation; and the error a config without a fixed size gets."""
from __future__ import annotations

import os

import pytest
import yaml

from tpu_pipeline.config import load_config
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.records import ConvertOptions, convert
from tpu_pipeline.records.image_folder import ImageFolderSource

from test_convert import FAST, make_image_folder

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def converted(tmp_path):
    make_image_folder(tmp_path / "images", per_class=10)
    source = ImageFolderSource(str(tmp_path / "images"), splits="train=0.8,validation=0.2", seed=1)
    return convert(source, str(tmp_path / "data" / "flowers"), ConvertOptions(min_shards=2, **FAST)).metadata


def shipped_config(tmp_path, **train) -> str:
    """configs/image_folder.yaml next to the data as the README lays it out, made small."""
    config = yaml.safe_load(open(os.path.join(REPO, "configs", "image_folder.yaml")))
    for section in ("data", "eval_data"):
        config[section].update(image_size=[16, 16], batch_size=8)
    config["model"]["cnn"] = {"filters": [8]}
    config["train"].update(run_dir=str(tmp_path / "run"), epochs=2, tensorboard=False, **train)
    (tmp_path / "configs").mkdir()
    path = tmp_path / "configs" / "image_folder.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_converted_folder_trains_from_image_size_alone(tmp_path, converted):
    from tpu_pipeline.train import train

    config = load_config(shipped_config(tmp_path))
    assert config.data.source.dir == str(tmp_path / "data" / "flowers")  # relative to the config file
    assert [op.op for op in config.data.preprocess] == ["decode_image", "resize", "value_range", "cast"]
    metrics = train(config, printer=lambda line: None)
    assert metrics["eval_examples"] == converted["splits"]["validation"]["num_examples"]
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0


def test_a_config_without_a_fixed_image_size_says_how_to_get_one(tmp_path, converted):
    from tpu_pipeline.train import train

    config = load_config(shipped_config(tmp_path), ["data.image_size=null", "data.preprocess=[{op: decode_image}]",
                                                    "data.outputs={inputs: image, targets: label}",
                                                    "data.augment=[{op: cast, key: label, dtype: int32}]"])
    with pytest.raises(ConfigError, match=r"shape \[None, None, 3\], which varies \(None\); .* set data.image_size"):
        train(config, printer=lambda line: None)


def test_image_size_and_preprocess_together_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"data.image_size fills data.preprocess itself"):
        load_config(base={"data": {"source": {"type": "tfrecord", "dir": "x"}, "image_size": [8, 8],
                                   "preprocess": ["decode_image"], "batch_size": 4}})


def test_a_validated_image_size_config_validates_again_as_itself():
    """The doctor and `config` re-validate a config's dump, which holds image_size and the ops it filled in:
    that is the same config, not the user's conflict (issue 47: `doctor` on configs/image_folder.yaml ended
    with 'image_size fills preprocess itself')."""
    from tpu_pipeline.bench.doctor import tune
    from tpu_pipeline.config.base import validate
    from tpu_pipeline.config.data import DataConfig

    config = load_config(os.path.join(REPO, "configs", "image_folder.yaml"), ["data.source.dir=x"]).data
    assert validate(DataConfig, config.model_dump(mode="python"), prefix="data") == config
    tuned = tune(config, ["data.options.private_threadpool_size=2"])
    assert tuned.preprocess == config.preprocess and tuned.options.private_threadpool_size == 2
    with pytest.raises(ConfigError, match=r"data.image_size fills data.preprocess itself"):  # a real change still is
        tune(config, ["data.preprocess=[decode_image]"])

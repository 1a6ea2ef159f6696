"""`tpu-pipeline demo --show N`: one image of the first N examples a config's training pipeline delivers, augmented,
each captioned with its class or its soft target's two largest classes; and the doctor's advice when the
augmentation is what the input waits on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from tpu_pipeline.bench.augment_advice import augmentation_advice
from tpu_pipeline.bench.doctor import StageCost, _name_bottleneck
from tpu_pipeline.bench.contact_sheet import CAPTION_HEIGHT, MIN_TILE, caption, contact_sheet
from tpu_pipeline.errors import ConfigError

from helpers import data_config, write_jpeg_shards

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_captions_name_the_class_or_the_two_largest_shares():
    assert caption(np.array(3)) == "class 3"
    soft = np.full(10, 0.01)
    soft[[7, 2]] = [0.55, 0.37]
    assert caption(soft) == "class 7: 55%, class 2: 37%"
    assert caption(np.eye(4)[1] * 0.9 + 0.025) == "class 1: 92%, class 0: 2%"


def test_the_sheet_tiles_the_first_n_examples_in_rows_of_eight():
    batches = [(np.full((4, 160, 192, 3), value, np.float32), np.arange(4) + value) for value in range(3)]
    sheet = contact_sheet(iter(batches), 10)
    assert sheet.shape == (2 * (160 + CAPTION_HEIGHT), 8 * 192, 3) and sheet.dtype == np.uint8
    small = contact_sheet(iter([(np.zeros((2, 10, 12, 1)), np.arange(2))]), 2)  # enlarged: room for a caption
    assert small.shape == (10 * 11 + CAPTION_HEIGHT, 2 * 12 * 11, 3) and 12 * 11 >= MIN_TILE
    with pytest.raises(ConfigError, match="data.outputs"):
        contact_sheet(iter([{"a": np.zeros((2, 4, 4, 3)), "b": np.zeros((2, 4, 4, 3))}]), 2)


def test_demo_show_writes_the_augmented_examples_with_their_soft_targets(tmp_path):
    files = write_jpeg_shards(tmp_path / "data", 32, 2, size=24)
    config = {"data": data_config(files, preprocess=[{"op": "decode_image", "format": "jpeg"}, {"op": "resize", "size": 24},
                                                     {"op": "cast", "key": "label", "dtype": "int32"}],
                                  augment=[{"op": "randaugment", "num_layers": 2, "magnitude": 9},
                                           {"op": "mixup_cutmix", "num_classes": 4}],
                                  batch_size=8, outputs={"inputs": "image", "targets": "label"})}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    sheet = tmp_path / "out" / "sheet.png"
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "demo", "--config", str(path), "--show", "12",
                             "--show_path", str(sheet)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"contact sheet: 12 examples of data" in result.stdout and "examples/s" not in result.stdout
    assert Image.open(sheet).size == (8 * 24 * 6, 2 * (24 * 6 + CAPTION_HEIGHT))  # enlarged 6x: 144 >= MIN_TILE


def test_the_doctor_names_augmentation_and_the_fixes_when_it_is_the_costliest_stage():
    advice = augmentation_advice("augment[2] randaugment")
    assert advice and "data.num_parallel_calls" in advice and "tpu-pipeline serve" in advice and "big_vision" in advice
    assert "mixup_cutmix" in augmentation_advice("augment[3] random_erasing + augment[4] mixup_cutmix")
    assert augmentation_advice("augment[0] decode_and_random_crop_jpeg") is None
    stages = [StageCost("batch", 1e-5), StageCost("parse (per_example)", 1e-4),
              StageCost("augment[0] decode_and_random_crop_jpeg", 1e-3), StageCost("augment[2] randaugment", 3e-3),
              StageCost("augment[3] normalize", 2e-4)]
    line = _name_bottleneck(stages, SimpleNamespace(limit=100.0, compute_bound=100.0), 0.5, [], None)
    assert "costliest stage: augment[2] randaugment" in line
    assert "Image augmentation (randaugment) is the costliest stage: give it more cores" in line
    stages[3] = StageCost("augment[2] randaugment", 1e-4)
    assert "Image augmentation" not in _name_bottleneck(stages, SimpleNamespace(limit=100.0, compute_bound=100.0),
                                                        0.5, [], None)

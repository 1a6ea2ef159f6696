"""Built-in preprocessing ops on real JPEG bytes, and user-registered ops."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import get_op, register_op, registered_ops


def op(name: str, **kwargs):
    return get_op(name).build(kwargs)


def jpeg(height: int = 40, width: int = 60, seed: int = 0) -> tuple[bytes, np.ndarray]:
    """A smooth colour gradient with mild noise (what JPEG compresses well) and its pixels."""
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([yy * 255 / height, xx * 255 / width, (yy + xx) * 127 / (height + width)], axis=-1)
    noise = np.random.default_rng(seed).normal(0, 4, base.shape)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    return tf.io.encode_jpeg(pixels, quality=100).numpy(), pixels


def test_the_issue_ops_are_registered():
    for name in ["decode_image", "decode_and_random_crop_jpeg", "decode_and_center_crop_jpeg", "resize",
                 "center_crop", "random_flip", "normalize", "value_range", "cast", "onehot", "keep"]:
        assert name in registered_ops()
    assert get_op("random_flip").random and get_op("decode_and_random_crop_jpeg").random
    assert not get_op("resize").random


def test_decode_jpeg_and_png():
    data, pixels = jpeg()
    image = op("decode_image", format="jpeg")({"image": tf.constant(data)})["image"]
    assert image.shape == (40, 60, 3) and image.dtype == tf.uint8
    assert np.abs(image.numpy().astype(int) - pixels).mean() < 4  # JPEG is lossy, but close
    png = tf.io.encode_png(pixels).numpy()
    decoded = op("decode_image")({"image": tf.constant(png)})["image"]
    np.testing.assert_array_equal(decoded.numpy(), pixels)


def test_fused_random_crop_is_static_and_seeded():
    data, _ = jpeg(80, 120)
    crop = op("decode_and_random_crop_jpeg", size=32, area_range=[0.2, 0.5])
    seed_a, seed_b = tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64)
    a1 = crop({"image": tf.constant(data)}, seed_a)["image"]
    a2 = crop({"image": tf.constant(data)}, seed_a)["image"]
    b = crop({"image": tf.constant(data)}, seed_b)["image"]
    assert a1.shape == (32, 32, 3) and a1.dtype == tf.float32
    np.testing.assert_array_equal(a1.numpy(), a2.numpy())
    assert not np.array_equal(a1.numpy(), b.numpy())


def test_center_crop_jpeg_matches_crop_of_decoded():
    data, _ = jpeg(64, 64)
    decoded = tf.io.decode_jpeg(data).numpy()
    fused = op("decode_and_center_crop_jpeg", size=32, crop_padding=32)({"image": tf.constant(data)})["image"]
    # 32/(32+32) of the short side: the central 32x32 window, resized 32 → 32 (identity).
    # Border pixels differ slightly (chroma upsampling looks at neighbours outside the window).
    np.testing.assert_allclose(fused.numpy()[2:-2, 2:-2], decoded[18:46, 18:46].astype(np.float32), atol=2.0)
    assert not np.allclose(fused.numpy()[2:-2, 2:-2], decoded[10:38, 10:38], atol=2.0)


def test_resize_center_crop_flip():
    image = tf.reshape(tf.range(4 * 6 * 1, dtype=tf.float32), (4, 6, 1))
    assert op("resize", size=[8, 12])({"image": image})["image"].shape == (8, 12, 1)
    cropped = op("center_crop", size=2)({"image": image})["image"]
    np.testing.assert_array_equal(cropped.numpy()[..., 0], [[8, 9], [14, 15]])
    flip = op("random_flip")
    outcomes = {bool(np.array_equal(flip({"image": image}, tf.constant([s, 0], tf.int64))["image"].numpy(), image.numpy()[:, ::-1]))
                for s in range(16)}
    assert outcomes == {True, False}


def test_normalize_value_range_cast_onehot_keep():
    image = tf.constant([[[0.0, 127.5, 255.0]]])
    normalized = op("normalize", mean=[0.0, 127.5, 255.0], std=[1.0, 2.0, 5.0])({"image": image})["image"]
    np.testing.assert_allclose(normalized.numpy(), [[[0.0, 0.0, 0.0]]])
    ranged = op("value_range", min=-1, max=1)({"image": image})["image"]
    np.testing.assert_allclose(ranged.numpy(), [[[-1.0, 0.0, 1.0]]])
    cast = op("cast", dtype="bfloat16")({"image": image})["image"]
    assert cast.dtype == tf.bfloat16
    label = op("cast", key="label", dtype="int32")({"label": tf.constant(3, tf.int64)})["label"]
    assert label.dtype == tf.int32 and int(label) == 3
    onehot = op("onehot", depth=4)({"label": tf.constant(2, tf.int64)})["label"]
    np.testing.assert_array_equal(onehot.numpy(), [0, 0, 1, 0])
    kept = op("keep", keys=["label"])({"label": label, "id": label})
    assert list(kept) == ["label"]


def test_op_on_a_missing_feature_names_it():
    with pytest.raises(ConfigError, match=r"op 'resize': feature 'img' does not exist.*features here: image"):
        op("resize", size=4, key="img")({"image": tf.zeros([2, 2, 1])})


def test_register_op_and_refuse_duplicates():
    @register_op("times_two_test", replace=True)
    def times_two(key: str = "x"):
        return lambda features, seed=None: {**features, key: features[key] * 2}

    assert op("times_two_test")({"x": tf.constant(3)})["x"].numpy() == 6
    with pytest.raises(ValueError, match="already registered"):
        register_op("times_two_test")(times_two)


def test_validating_a_config_does_not_initialize_tensorflow():
    """Config validation builds every op; none may start the TF runtime (see ops/image.py)."""
    import subprocess
    import sys

    code = (
        "import tensorflow as tf\n"
        "from tpu_pipeline.config import load_config\n"
        "load_config('configs/imagenet_resnet.yaml'); load_config('configs/demo.yaml')\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "print(len(tf.config.list_logical_devices('CPU')))\n"
    )
    import os

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "2"

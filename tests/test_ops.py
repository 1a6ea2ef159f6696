"""Built-in preprocessing ops on real JPEG bytes, and user-registered ops."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import build_ops, check_ops, get_op, keyed, register_op, registered_ops, scoped_ops

from helpers import data_config

pytestmark = pytest.mark.tf_builds


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


def test_a_missing_feature_inside_a_pipeline_is_a_one_line_error(tmp_path):
    """Raised while tf.data traces the map: AutoGraph must not append its "in user code:" trace (any op)."""
    from helpers import write_jpeg_shards
    from tpu_pipeline.pipeline import Pipeline

    config = data_config(write_jpeg_shards(tmp_path, 4, 1))
    config["preprocess"][1] = {"op": "resize", "size": 16, "key": "img"}
    with pytest.raises(ConfigError) as error:
        Pipeline.from_config(config_from_dict({"data": config}).data).build()
    message = str(error.value)
    assert "\n" not in message and "in user code" not in message, message
    assert "op 'resize': feature 'img' does not exist at this point of the pipeline; features here: id, image, " \
           "label" in message, message


def test_register_op_and_refuse_duplicates():
    with scoped_ops():
        @register_op("times_two_test")
        def times_two(key: str = "x"):
            return lambda features, seed=None: {**features, key: features[key] * 2}

        assert op("times_two_test")({"x": tf.constant(3)})["x"].numpy() == 6
        with pytest.raises(ValueError, match="already registered"):
            register_op("times_two_test")(times_two)
    assert "times_two_test" not in registered_ops()


def test_scoped_ops_restores_the_registry():
    before = registered_ops()
    original_resize = get_op("resize")
    with pytest.raises(RuntimeError, match="boom"), scoped_ops():
        register_op("scoped_new_test")(lambda: None)
        register_op("resize", replace=True)(lambda: None)
        assert "scoped_new_test" in registered_ops() and get_op("resize") is not original_resize
        raise RuntimeError("boom")  # restored on the way out of a failing test too
    assert registered_ops() == before and get_op("resize") is original_resize


def test_keyed_op_reads_key_and_writes_out_key():
    with scoped_ops():
        @register_op("add_test", batchable=True)
        @keyed(default_key="x")
        def add(amount: float = 1.0):
            """Adds `amount`."""
            return lambda value, seed=None: value + amount

        assert add.__name__ == "add" and add.__doc__ == "Adds `amount`."
        assert list(inspect.signature(add).parameters) == ["amount", "key", "out_key"]
        assert get_op("add_test").parameters() == ["amount", "key", "out_key"]
        features = {"x": tf.constant(1.0), "y": tf.constant(10.0)}
        in_place = op("add_test", amount=2.0)(features)
        assert set(in_place) == {"x", "y"} and float(in_place["x"]) == 3.0 and float(in_place["y"]) == 10.0
        other = op("add_test", key="y", out_key="z")(features)
        assert set(other) == {"x", "y", "z"} and float(other["z"]) == 11.0 and float(other["y"]) == 10.0
        with pytest.raises(ConfigError, match=r"op 'add': feature 'w' does not exist.*features here: x, y"):
            op("add_test", key="w")(features)
        with pytest.raises(ConfigError, match=r"data.preprocess\[0\]: op 'add': out_key must be a feature name"):
            get_op("add_test").build({"out_key": 3}, "data.preprocess[0]")
    with pytest.raises(TypeError, match="already has"):
        keyed(default_key="x")(lambda key="x": None)


def test_builtin_ops_take_out_key():
    image = tf.zeros([4, 6, 3])
    resized = op("resize", size=2, out_key="small")({"image": image})
    assert resized["image"].shape == (4, 6, 3) and resized["small"].shape == (2, 2, 3)
    onehot = op("onehot", depth=3, out_key="target")({"label": tf.constant(1)})
    np.testing.assert_array_equal(onehot["target"].numpy(), [0, 1, 0])
    assert int(onehot["label"]) == 1


def test_bad_arguments_list_the_signature_with_key_and_out_key():
    with pytest.raises(ConfigError) as error:
        get_op("resize").check({"sise": 3, "size": 3}, "data.augment[0]")
    message = str(error.value)
    assert message.startswith("data.augment[0]: bad arguments for op 'resize'") and "sise" in message
    assert "its arguments are: size, method='bilinear', antialias=False, key='image', out_key=None" in message
    assert "\n" not in message


def test_check_ops_checks_names_and_arguments_without_calling_factories():
    calls = []
    with scoped_ops():
        @register_op("counted_test")
        @keyed(default_key="image")
        def counted(scale: float):
            calls.append(scale)
            return lambda image, seed=None: image * scale

        config = config_from_dict({"data": data_config("x*", augment=[{"op": "counted_test", "scale": 2.0}])})
        check_ops(config.data)
        assert calls == []
        bad = config_from_dict({"data": data_config("x*", augment=[{"op": "counted_test", "sclae": 2.0}])})
        with pytest.raises(ConfigError, match=r"data.augment\[0\]: bad arguments for op 'counted_test'.*scale, key="):
            check_ops(bad.data)
        assert calls == []
        fns, random = build_ops(config.data.augment, "data.augment")
        assert calls == [2.0] and random == [False]
        assert float(fns[0]({"image": tf.constant(1.5)})["image"]) == 3.0
    check_ops(None)  # a config without this section


def test_argument_values_are_checked_when_the_pipeline_is_built():
    """check_ops binds names only; a bad value is a ConfigError from the factory, naming the key."""
    config = config_from_dict({"data": data_config("x*", preprocess=[
        {"op": "decode_image"}, {"op": "cast", "dtype": "float99"}, {"op": "resize", "size": -3}])})
    check_ops(config.data)
    with pytest.raises(ConfigError, match=r"^data.preprocess\[1\]: op 'cast': unknown dtype 'float99'; use e.g."):
        build_ops(config.data.preprocess, "data.preprocess")
    config.data.preprocess[1].args["dtype"] = "float32"
    with pytest.raises(ConfigError, match=r"^eval_data.preprocess\[2\]: op 'resize': size must be positive, got -3$"):
        build_ops(config.data.preprocess, "eval_data.preprocess")


def test_a_factory_may_run_tensorflow_ops():
    with scoped_ops():
        @register_op("shift_test", batchable=True)
        @keyed(default_key="x")
        def shift(values):
            table = tf.constant(values, tf.float32) * 2.0  # eager TF at build time
            return lambda x, seed=None: x + tf.reduce_sum(table)

        config = config_from_dict({"data": data_config("x*", augment=[{"op": "shift_test", "values": [1, 2]}])})
        check_ops(config.data)
        fns, _ = build_ops(config.data.augment, "data.augment")
        dataset = tf.data.Dataset.from_tensor_slices({"x": [0.0, 1.0]}).map(lambda f: fns[0](f))
        assert [float(f["x"]) for f in dataset] == [6.0, 7.0]
        with pytest.raises(ConfigError, match=r"^data.augment\[0\]: op 'shift_test': "):
            get_op("shift_test").build({"values": [[1], [2, 3]]}, "data.augment[0]")  # TF's ValueError


def test_config_layer_imports_no_ops():
    """Layering: config is a leaf above errors/system; it must not import ops (or any higher layer)."""
    import ast

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tpu_pipeline")
    allowed = ("tpu_pipeline.config", "tpu_pipeline.errors", "tpu_pipeline.system")
    for name in sorted(os.listdir(os.path.join(root, "config"))):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(root, "config", name)) as handle:
            tree = ast.parse(handle.read())
        for node in ast.walk(tree):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for module in modules:
                if module.startswith("tpu_pipeline"):
                    assert module.startswith(allowed), f"config/{name} imports {module}"


def test_validating_a_config_does_not_initialize_tensorflow():
    """Config validation does not even import tpu_pipeline.ops, and check_ops calls no factory:
    afterwards TF can still split the CPU into logical devices (only possible before it initializes)."""
    code = (
        "import sys, types\n"
        "import tensorflow as tf\n"
        # The package __init__ imports every layer; a bare package shows what config itself imports.
        "package = types.ModuleType('tpu_pipeline'); package.__path__ = ['tpu_pipeline']\n"
        "sys.modules['tpu_pipeline'] = package\n"
        "from tpu_pipeline.config import load_config\n"
        "configs = [load_config('configs/imagenet_resnet.yaml'), load_config('configs/demo.yaml')]\n"
        "assert not [m for m in sys.modules if m.startswith('tpu_pipeline.ops')], 'config imported ops'\n"
        "from tpu_pipeline.ops import check_ops, keyed, register_op\n"
        "@register_op('eager_test')\n"
        "@keyed(default_key='image')\n"
        "def eager(scale=2.0):\n"
        "    raise AssertionError('check_ops called a factory: ' + str(tf.constant(scale)))\n"
        "configs[1].data.augment.append(configs[1].data.augment[0].model_copy(update={'op': 'eager_test'}))\n"
        "for config in configs:\n"
        "    check_ops(config.data, 'data'); check_ops(config.eval_data, 'eval_data')\n"
        "cpu = tf.config.list_physical_devices('CPU')[0]\n"
        "tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)\n"
        "print(len(tf.config.list_logical_devices('CPU')))\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "2"

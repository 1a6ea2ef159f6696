"""RandAugment's ops against tensorflow/models' own (tf-models-official's augment.py, loaded as the package), on
the two photographs scikit-learn ships; and the `randaugment` op's draws: seeded, static-shaped, each choice
(no change included) equally likely."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import get_op
from tpu_pipeline.ops.randaugment import OPS, SIGNED, apply_op, op_argument

from augment_reference import photos, tfm_augment

pytestmark = pytest.mark.tf_builds

MAGNITUDE = 9.0  # DeiT's and the recipe
GRAY = [128, 128, 128]


def tfm_op(name: str, image: tf.Tensor, argument, center_y: int, center_x: int) -> tf.Tensor:
    """TFM's function for `name` with the argument given (its own `level_to_arg` would draw the side)."""
    tfm = tfm_augment()
    if name in ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY"):
        return tfm.NAME_TO_FUNC[name](image, argument, GRAY)
    if name == "Cutout":  # TFM's cutout draws its center from TF's global state: its fill at ours
        return tfm._fill_rectangle(image, center_x, center_y, argument, argument, 128)
    if name in ("AutoContrast", "Equalize", "Invert"):
        return tfm.NAME_TO_FUNC[name](image)
    return tfm.NAME_TO_FUNC[name](image, argument)


def test_each_ops_argument_at_each_magnitude_is_tfms():
    """What the magnitude means: TFM's level_to_arg (the side of a signed op aside) at 0..10."""
    tfm_arguments = tfm_augment().level_to_arg(40.0, 100.0)
    for name in OPS:
        for level in (0.0, 1.0, 3.0, 5.0, 9.0, 10.0):
            expected = tfm_arguments[name](level)
            expected = expected[0] if expected else None
            ours = op_argument(name, level)
            if name in SIGNED:
                assert abs(float(expected)) == pytest.approx(ours), (name, level)
            else:
                assert (ours is None and expected is None) or float(expected) == pytest.approx(float(ours)), (name, level)


@pytest.mark.parametrize("side", [1, -1])
def test_each_op_at_magnitude_9_computes_what_tfm_computes_on_real_photographs(side):
    """Every op of the set, each side of the signed ones, on both photographs (224 x 224): within one
    intensity level of TFM's output, and (but for the ops a photo may leave alone) a real change."""
    changed = set()
    for index, photo in enumerate(photos()):
        image = tf.constant(photo)
        for name in OPS:
            argument = op_argument(name, MAGNITUDE)
            if name in SIGNED:
                argument = side * argument
            center_y, center_x = (50, 170) if index else (200, 20)  # Cutout cut at a border on the first photo
            ours = apply_op(name, image, argument, center_y, center_x).numpy()
            theirs = tfm_op(name, image, argument, center_y, center_x).numpy()
            assert ours.shape == theirs.shape == photo.shape and ours.dtype == np.uint8, name
            difference = np.abs(ours.astype(int) - theirs.astype(int)).max()
            assert difference <= 1, f"{name} (side {side}, photo {index}): {difference} levels from TFM's"
            if not np.array_equal(ours, photo):
                changed.add(name)
    assert changed == set(OPS), f"left both photos as they were: {set(OPS) - changed}"


def test_the_geometric_ops_give_tfms_pixels_at_any_magnitude():
    """Shifts and shears are index gathers here and a projective transform in TFM: the same pixels, for 40 magnitudes
    drawn over 0..10 (and beyond the image: shifts of up to 2.5 widths), each side."""
    image = tf.constant(photos(96)[0])
    rng = np.random.default_rng(1)
    for level in rng.uniform(0, 10, 40):
        for name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
            argument = op_argument(name, float(level), translate_const=240.0) * rng.choice([-1, 1])
            ours = apply_op(name, image, argument).numpy()
            assert np.array_equal(ours, tfm_op(name, image, argument, 0, 0).numpy()), (name, argument)


def randaugment(**kwargs):
    return get_op("randaugment").build({"key": "image", **kwargs})


def test_randaugment_is_a_function_of_its_seed_and_keeps_shape_and_dtype():
    op = randaugment(num_layers=2, magnitude=9)
    image = tf.constant(photos(64)[0])
    seeds = [tf.constant([7, n], tf.int64) for n in range(12)]
    outputs = [op({"image": image}, seed)["image"].numpy() for seed in seeds]
    again = [op({"image": image}, seed)["image"].numpy() for seed in seeds]
    assert all(np.array_equal(a, b) for a, b in zip(outputs, again))
    assert len({o.tobytes() for o in outputs}) >= 8  # 17 x 17 pairs of choices: most seeds differ
    assert all(o.shape == (64, 64, 3) and o.dtype == np.uint8 for o in outputs)
    as_float = op({"image": tf.cast(image, tf.float32)}, seeds[3])["image"]
    assert as_float.dtype == tf.float32 and np.array_equal(as_float.numpy(), outputs[3].astype(np.float32))


def test_one_layer_chooses_each_op_or_none_with_equal_chance_and_each_side_too():
    """TFM draws among len(ops) + 1 choices, the last no change: with one op, half the images change; a
    signed op shifts to either side alike."""
    op = randaugment(num_layers=1, magnitude=5, ops=["Invert"])
    image = tf.constant(photos(16)[1])
    inverted = sum(
        not np.array_equal(op({"image": image}, tf.constant([3, n], tf.int64))["image"].numpy(), photos(16)[1])
        for n in range(400))
    assert 160 <= inverted <= 240, inverted  # Binomial(400, 1/2): 4 standard deviations either side
    shift = randaugment(num_layers=1, magnitude=5, ops=["TranslateX"])
    sides = {side: apply_op("TranslateX", image, side * op_argument("TranslateX", 5.0)).numpy().tobytes() for side in (1, -1)}
    drawn = [shift({"image": image}, tf.constant([4, n], tf.int64))["image"].numpy().tobytes() for n in range(200)]
    left, right = drawn.count(sides[1]), drawn.count(sides[-1])
    assert left + right + drawn.count(photos(16)[1].tobytes()) == 200
    assert 25 <= left <= 75 and 25 <= right <= 75, (left, right)  # each side half of the half that shifts
    never = randaugment(num_layers=3, magnitude=5, prob_to_apply=0.0)
    assert np.array_equal(never({"image": image}, tf.constant([1, 2], tf.int64))["image"].numpy(), photos(16)[1])


def test_randaugment_runs_in_a_traced_map_with_static_shapes():
    op = randaugment(num_layers=2, magnitude=9, magnitude_std=0.5)
    images = tf.data.Dataset.from_tensor_slices(photos(32)).map(
        lambda image: op({"image": image}, tf.constant([0, 1], tf.int64))["image"])
    assert images.element_spec.shape == (32, 32, 3)
    assert len(list(images)) == 2


@pytest.mark.parametrize("arguments, message", [
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"magnitude": 11}, r"magnitude must be within 0\.\.10"),
    ({"ops": ["Rotate", "Blur"]}, r"Blur unknown"),
    ({"ops": "Rotate"}, "ops must be a non-empty list"),
    ({"prob_to_apply": 1.5}, r"prob_to_apply must be within 0\.\.1"),
])
def test_bad_arguments_are_one_line_naming_the_op(arguments, message):
    with pytest.raises(ConfigError, match=message):
        randaugment(**arguments)


def test_an_image_of_no_static_size_is_refused_naming_the_fix():
    op = randaugment()
    with pytest.raises(ConfigError, match="static shape.*decode_and_random_crop_jpeg"):
        tf.data.Dataset.from_tensors(tf.zeros([5, 5, 3], tf.uint8)).map(
            lambda image: op({"image": image[:tf.random.uniform([], 1, 5, tf.int32)]}, tf.constant([0, 0], tf.int64)))

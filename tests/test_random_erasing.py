"""`random_erasing`: with its probability, one rectangle wholly inside the image, of the area and aspect asked,
anywhere (the bottom and right borders included), filled with noise or a constant; a function of its seed."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import get_op

pytestmark = pytest.mark.tf_builds

HEIGHT, WIDTH = 40, 60


def erased(seed: int, **arguments) -> np.ndarray:
    """bool [H, W]: the pixels the op changed in an image of zeros (filled with 1.0)."""
    op = get_op("random_erasing").build({"fill": 1.0, **arguments})
    image = op({"image": tf.zeros([HEIGHT, WIDTH, 3])}, tf.constant([5, seed], tf.int64))["image"].numpy()
    assert (image[..., 0] == image[..., 2]).all()
    return image[..., 0] == 1.0


def rectangle(mask: np.ndarray) -> tuple[int, int, int, int]:
    rows, columns = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    top, bottom, left, right = rows[0], rows[-1] + 1, columns[0], columns[-1] + 1
    assert mask[top:bottom, left:right].all() and mask.sum() == (bottom - top) * (right - left)
    return top, bottom, left, right


def test_erases_one_rectangle_of_the_area_and_aspect_asked_anywhere_in_the_image():
    boxes = [rectangle(mask) for mask in (erased(seed, probability=1.0) for seed in range(300))]
    areas = np.array([(b - t) * (r - l) for t, b, l, r in boxes]) / (HEIGHT * WIDTH)
    aspects = np.array([(b - t) / (r - l) for t, b, l, r in boxes])
    # Sides are rounded to whole pixels: the area and aspect asked, within a pixel's rounding.
    assert areas.min() >= 0.02 * 0.7 and areas.max() <= (1 / 3) * 1.15
    assert aspects.min() >= 0.3 * 0.7 and aspects.max() <= (1 / 0.3) * 1.3
    assert 0.1 < np.median(areas) < 0.2  # uniform over [0.02, 1/3], the draws too big for the image redrawn
    assert any(b == HEIGHT for _, b, _, _ in boxes) and any(r == WIDTH for _, _, _, r in boxes)
    assert any(t == 0 for t, _, _, _ in boxes) and any(l == 0 for _, _, l, _ in boxes)


def test_erases_with_its_probability_and_as_its_seed_says():
    counts = sum(erased(seed, probability=0.25).any() for seed in range(400))
    assert 60 <= counts <= 140, counts  # Binomial(400, 1/4): 4 standard deviations either side
    assert all(np.array_equal(erased(seed, probability=0.5), erased(seed, probability=0.5)) for seed in range(10))


def test_several_rectangles_and_noise():
    assert max(erased(seed, probability=1.0, min_count=2, max_count=3).sum() for seed in range(20)) > 0.34 * HEIGHT * WIDTH
    op = get_op("random_erasing").build({"probability": 1.0})
    image = op({"image": tf.fill([HEIGHT, WIDTH, 3], 100.0)}, tf.constant([1, 1], tf.int64))["image"].numpy()
    noise = image[image != 100.0]
    assert noise.size > 0.02 * HEIGHT * WIDTH * 3 and abs(noise.mean()) < 0.3 and 0.7 < noise.std() < 1.3


@pytest.mark.parametrize("arguments, message", [
    ({"probability": 2}, r"probability must be within 0\.\.1"),
    ({"min_area": 0.5, "max_area": 0.2}, "min_area <= max_area"),
    ({"min_count": 2, "max_count": 1}, "min_count <= max_count"),
    ({"fill": "mean"}, "fill must be 'noise' or a number"),
])
def test_bad_arguments_name_the_op(arguments, message):
    with pytest.raises(ConfigError, match=message):
        get_op("random_erasing").build(arguments)


def test_noise_on_a_uint8_image_names_the_fix():
    op = get_op("random_erasing").build({})
    with pytest.raises(ConfigError, match="after 'normalize'"):
        op({"image": tf.zeros([8, 8, 3], tf.uint8)}, tf.constant([0, 0], tf.int64))

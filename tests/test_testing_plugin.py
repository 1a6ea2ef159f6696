"""tpu_pipeline.testing as a user meets it: docs/testing.md's example conftest and test, run in a fresh
pytest process (pytester), and the helpers' failure messages."""
from __future__ import annotations

import os
import re

import pytest

from tpu_pipeline.config import config_from_dict
from tpu_pipeline.pipeline import Pipeline
from tpu_pipeline.testing import assert_exactly_once, write_tfrecords

pytestmark = pytest.mark.tf_builds

GUIDE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "testing.md")


def guide_example() -> tuple[str, str]:
    text = open(GUIDE).read()
    section = text[text.index("# Testing your own pipelines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    conftest, test = code.split("# test_my_pipeline.py\n")
    return conftest.replace("# conftest.py\n", ""), test


def test_the_guide_example_passes_in_a_fresh_pytest(pytester):
    conftest, test = guide_example()
    pytester.makeconftest(conftest)
    pytester.makepyfile(test_my_pipeline=test)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_assert_exactly_once_names_repeats_and_gaps(tmp_path):
    files = write_tfrecords(tmp_path, {"x": {"dtype": "float32", "shape": [4]}}, num=50, num_shards=2)
    data = config_from_dict({"data": {"source": {"type": "tfrecord", "files": files, "sharding": "off"},
                                      "features": {"x": {"dtype": "float32", "shape": [4]}, "id": {"dtype": "int64"}},
                                      "batch_size": 8, "repeat": 1}}).data
    pipeline = Pipeline.from_config(data)
    with pytest.raises(AssertionError, match=r"not exactly once over 2 input pipeline\(s\), 2 replica\(s\): repeated \[\d+, "):
        assert_exactly_once(pipeline, 50, num_input_pipelines=2, num_replicas=2)  # sharding off: both read all
    one = Pipeline.from_config(data.model_copy(update={"shuffle": data.shuffle.model_copy(update={"enabled": False})}))
    with pytest.raises(AssertionError, match=r"repeated \[\], missing \[\d+, \d+\] \(2 in all; a dropped remainder"):
        assert_exactly_once(one, 50)  # drop_remainder: the last 2 of 50 in batches of 8

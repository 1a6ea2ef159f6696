"""The pytest plugin keeps a user's failing test as readable as the CLI's output: TensorFlow's C++
INFO lines and its start-up lines are hidden, the test's own warnings are kept, and a
TF_CPP_MIN_LOG_LEVEL the user sets wins."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.tf_builds

USER_TEST = '''
import logging
import os

import tensorflow as tf

from tpu_pipeline.testing import write_tfrecords


def test_reads_one_too_many(tmp_path, cpu_strategy):
    files = write_tfrecords(tmp_path, {"x": {"dtype": "float32", "shape": [4]}}, num=10)
    count = sum(1 for _ in tf.data.TFRecordDataset(tf.io.gfile.glob(files)))  # TF logs an INFO line here
    logging.getLogger("mine").warning("my own warning")
    print("TF_CPP_MIN_LOG_LEVEL=" + os.environ.get("TF_CPP_MIN_LOG_LEVEL", "unset"))
    assert count == 11
'''

INFO_LINE = "TFRecordDataset `buffer_size` is unspecified"


def run_user_session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, log_level: str | None):
    """A user's project: the plugin in the top conftest, one failing test, run in a fresh process
    with the environment a user has (our own conftest sets TF_CPP_MIN_LOG_LEVEL; a user's may not)."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    if log_level is not None:
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", log_level)
    pytester.makeconftest('pytest_plugins = ["tpu_pipeline.testing"]\n')
    pytester.makepyfile(test_mine=USER_TEST)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    return "\n".join(result.outlines + result.errlines)


def test_a_failing_test_shows_no_tensorflow_info_or_startup_lines(pytester, monkeypatch):
    output = run_user_session(pytester, monkeypatch, log_level=None)
    assert INFO_LINE not in output
    assert "cuda" not in output.lower() and "oneDNN" not in output
    assert "my own warning" in output  # warnings (Python's, and TF's C++ ones at level 1) are kept
    assert "TF_CPP_MIN_LOG_LEVEL=1" in output


def test_the_users_own_log_level_wins(pytester, monkeypatch):
    output = run_user_session(pytester, monkeypatch, log_level="0")
    assert INFO_LINE in output  # so the test above could fail: the line is there to hide
    assert "TF_CPP_MIN_LOG_LEVEL=0" in output

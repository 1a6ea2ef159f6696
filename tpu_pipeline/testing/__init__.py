"""Helpers for your own tests of input pipelines, on a CPU that stands in for 8 TPU cores.

As a pytest plugin, in your `conftest.py`:

    pytest_plugins = ["tpu_pipeline.testing"]

it splits the CPU into logical devices before TensorFlow starts (8, or `tpu_pipeline_cpus` in your
pytest ini) and gives the `cpu_strategy` fixture: a real MirroredStrategy over them. It keeps
TensorFlow's C++ INFO lines (`TFRecordDataset buffer_size is unspecified ...`) and its start-up
lines out of your failing tests' captured output, as the CLI does; set TF_CPP_MIN_LOG_LEVEL=0
yourself to see them. The helpers
work with or without the plugin:

    files = write_tfrecords(tmp_path, {"image": {"dtype": "string"}, "label": {"dtype": "int64"}}, num=100)
    assert_exactly_once(pipeline, num_examples=100, num_input_pipelines=2, num_replicas=8)
    assert_tpu_ready(pipeline.build())
"""
# First: TF's log level, set before anything below imports TensorFlow.
from tpu_pipeline.testing import tf_log_level  # noqa: F401

from tpu_pipeline.testing.checks import assert_exactly_once, assert_tpu_ready
from tpu_pipeline.testing.data import write_tfrecords
from tpu_pipeline.testing.plugin import cpu_strategy, pytest_addoption, pytest_configure

__all__ = ["assert_exactly_once", "assert_tpu_ready", "cpu_strategy", "pytest_addoption", "pytest_configure",
           "write_tfrecords"]

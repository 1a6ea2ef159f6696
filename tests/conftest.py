"""Test session setup: split the one CPU into 8 logical devices before TensorFlow initializes.

Tests that need several replicas use `tf.distribute.MirroredStrategy(cpu_devices)` over these
logical devices; everything else sees them as one ordinary CPU host.
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

_USER_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL" in os.environ  # yours: TensorFlow's start-up lines are shown
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402

import tpu_pipeline  # noqa: E402,F401  (first: under the TPU TensorFlow with no TPU here, TF must start without libtpu)
from tpu_pipeline.system import fewer_collections, native_stderr_silenced  # noqa: E402

fewer_collections()  # the CLI's garbage-collector thresholds: a worker traces graphs all day (tpu_pipeline/system.py)
NUM_LOGICAL_CPUS = 8

# TensorFlow's C++ start-up lines (oneDNN, CUDA stubs, cuInit) ignore TF_CPP_MIN_LOG_LEVEL: without this, pytest's
# own process printed seven of them into the README's test command's output.
with native_stderr_silenced(not _USER_LOG_LEVEL):
    import tensorflow as tf  # noqa: E402

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_LOGICAL_CPUS)]
    )
    tf.config.list_logical_devices()  # TensorFlow's context (and its device probing) starts now, while silenced

if os.environ.get("TPU_PIPELINE_TEST_FORK_SERVER", "1") != "0":
    import fork_server  # noqa: E402  (children forked with TensorFlow imported: tests/fork_server.py)

    fork_server.install()

pytest_plugins = [
    "pytester",  # tests/test_testing_plugin.py runs a user's test session
    "suite_rule",  # which tests run under which TensorFlow (tests/suite_rule.py, docs/testing.md)
]


@pytest.fixture(autouse=True)
def _absl_flags_unparsed_after_each_test():
    """A test that runs the CLI in this process (tpu_pipeline.cli.main) leaves absl's flags parsed, and
    --config is a multi-flag: the next in-process call would layer its config on this one's. Which test comes
    next depends on how the workers share the files, so no test may leave them parsed."""
    yield
    from absl import flags

    if flags.FLAGS.is_parsed():
        flags.FLAGS.unparse_flags()


@pytest.fixture(scope="session")
def cpu_devices() -> list[str]:
    """Names of the 8 logical CPU devices, e.g. for MirroredStrategy(devices=...)."""
    return [d.name for d in tf.config.list_logical_devices("CPU")]


@pytest.fixture(scope="session")
def eight_replica_strategy(cpu_devices) -> tf.distribute.Strategy:
    """A real MirroredStrategy with 8 replicas over the logical CPUs.

    Taken from the resolver, which keeps one strategy per device set: a second MirroredStrategy
    over the same devices in this process would collide with the first's collective keys.
    """
    from tpu_pipeline.cluster.resolver import mirrored_strategy

    strategy = mirrored_strategy(cpu_devices)
    assert strategy.num_replicas_in_sync == NUM_LOGICAL_CPUS
    return strategy


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory) -> str:
    """One cache directory for the built-in demo set, shared by every test that runs the demo."""
    return str(tmp_path_factory.mktemp("demo_cache"))


# Under `-n 3 --dist loadgroup` (scripts/run_tests.sh), the worker processes share the work in units: each
# test marked slow (real child processes, which its test mostly waits on) is a unit of its own, and each
# other file is one (its module fixtures built once). A free worker takes the next unit, so they finish
# together, and the order sends the largest first: the in-process files known to be heaviest, then the slow
# tests, then the other files in file order (the many small ones fill the end). docs/testing.md has the
# measurements behind this. pytest-xdist's own `xdist_group` marks cannot make such units under pytest 9.2
# (xdist 3.8, the newest, renames a node id that pytest no longer reads from that attribute: two tests of one
# group ran on different workers), so the workers write down which tests are slow, and the scheduler here
# reads that.
_SLOW_TESTS_ENV = "TPU_PIPELINE_TEST_SLOW_IDS"
if "PYTEST_XDIST_WORKER" not in os.environ:  # the controlling process: the workers inherit the path
    os.environ[_SLOW_TESTS_ENV] = os.path.join(tempfile.gettempdir(), f"tpu_pipeline_slow_tests.{os.getpid()}")

# In-process files measured heaviest (docs/testing.md, "Where the time goes"), sent first. A stale entry
# only changes the order in which units are sent, never what runs.
_HEAVY_FILES = ("tests/test_sequence_pipelines.py", "tests/test_train.py", "tests/test_jax_models.py",
                "tests/test_doctor.py", "tests/test_mixture_resume.py", "tests/test_mixture_memory_read.py",
                "tests/test_mixture_rates.py", "tests/test_resume.py")


def _send_order(item) -> tuple[int, int]:
    module = item.nodeid.split("::")[0]
    if module in _HEAVY_FILES:
        return 0, _HEAVY_FILES.index(module)
    return (1, 0) if item.get_closest_marker("slow") else (2, 0)


def pytest_collection_modifyitems(config, items) -> None:
    if "PYTEST_XDIST_WORKER" in os.environ and os.environ.get(_SLOW_TESTS_ENV):
        items.sort(key=_send_order)  # stable: file order within each rank; the same on every worker
        path = os.environ[_SLOW_TESTS_ENV]
        with open(f"{path}.{os.environ['PYTEST_XDIST_WORKER']}", "w") as handle:
            handle.writelines(f"{item.nodeid}\n" for item in items if item.get_closest_marker("slow"))
        os.replace(handle.name, path)  # whole before this worker reports its collection


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep the order above, not xdist's "most tests first"

    class SlowTestOrFile(LoadScopeScheduling):
        """Units of work: each slow test by itself; each other file."""

        slow: Optional[set] = None

        def _split_scope(self, nodeid: str) -> str:
            if self.slow is None:  # read once every worker has collected (before the first schedule)
                with open(os.environ[_SLOW_TESTS_ENV]) as handle:
                    self.slow = set(handle.read().splitlines())
                os.remove(handle.name)
            return nodeid if nodeid in self.slow else nodeid.split("::")[0]

    return SlowTestOrFile(config, log)

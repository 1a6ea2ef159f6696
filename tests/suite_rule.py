"""Which tests run under which TensorFlow: a marker every test file carries, read here (docs/testing.md).

CI runs the whole suite under the registry's TensorFlow (.venv), then again under the TPU TensorFlow
(.venv-tpu, `run_tests.sh --tpu`, which passes `--tf-builds-only`). The second run repeats only what can
behave differently under another TensorFlow build:

- `pytest.mark.tf_builds`: tf.data ops, packing and placement, checkpoints, the model, `train`, the TPU
  checks, the same-batches recordings: anything that runs TensorFlow's kernels, tracing or file formats in
  a way one build could do differently. Runs under both.
- `pytest.mark.tf_independent`: config parsing, the docs, the CLI's wording, convert's file handling, pure
  Python logic: what no TensorFlow build can change. Runs once, under the registry's TensorFlow.

A file states one of the two (`pytestmark = pytest.mark.tf_builds`, beside any other marks). A test file
that states neither, or both, stops the collection with a line naming it, so a new file is classified the
day it is written (tests/test_suite_rule.py checks that it does).
"""
from __future__ import annotations

import os

import pytest

BOTH = "tf_builds"
ONCE = "tf_independent"
OPTION = "--tf-builds-only"


def pytest_addoption(parser) -> None:
    parser.addoption(OPTION, action="store_true", default=False,
                     help=f"run only the tests marked {BOTH} (CI's run under the TPU TensorFlow)")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", f"{BOTH}: may behave differently under another TensorFlow build; "
                                       "runs under both TensorFlows (docs/testing.md)")
    config.addinivalue_line("markers", f"{ONCE}: no TensorFlow build can change it; runs once, under the "
                                       "registry's TensorFlow (docs/testing.md)")


def classification(item) -> set[str]:
    """The rule's markers that `item`'s file (or the test itself) states."""
    return {name for name in (BOTH, ONCE) if item.get_closest_marker(name) is not None}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    unclassified = sorted({os.path.relpath(str(item.path), str(config.rootpath)) for item in items
                           if len(classification(item)) != 1})
    if unclassified:
        raise pytest.UsageError(
            f"{', '.join(unclassified)}: state which TensorFlows run it: add `pytestmark = pytest.mark.{BOTH}` "
            f"(it may behave differently under another TensorFlow build) or `pytest.mark.{ONCE}` (it cannot); "
            "the rule is in docs/testing.md")
    if config.getoption(OPTION):
        once = [item for item in items if ONCE in classification(item)]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [item for item in items if ONCE not in classification(item)]

"""The rule of which tests run under which TensorFlow (tests/suite_rule.py, docs/testing.md) holds for every
file: a new test file that states no class stops the collection, and `--tf-builds-only` (CI's run under the
TPU TensorFlow) leaves out exactly the tests marked tf_independent."""
from __future__ import annotations

import ast
import os

import pytest

pytestmark = pytest.mark.tf_independent

TESTS = os.path.dirname(os.path.abspath(__file__))
CLASSES = {"tf_builds", "tf_independent"}

BOTH = "import pytest\npytestmark = pytest.mark.tf_builds\ndef test_kernels():\n    pass\n"
ONCE = "import pytest\npytestmark = [pytest.mark.tf_independent]\ndef test_wording():\n    pass\n"


def stated_classes(path: str) -> set[str]:
    """The rule's markers named in a file's module-level `pytestmark`."""
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)} & CLASSES
    return set()


def test_every_test_file_here_states_exactly_one_class():
    files = sorted(name for name in os.listdir(TESTS) if name.startswith("test_") and name.endswith(".py"))
    assert len(files) > 90, files
    wrong = {name: stated_classes(os.path.join(TESTS, name)) for name in files}
    assert not {name: found for name, found in wrong.items() if len(found) != 1}


def test_a_new_file_that_states_no_class_stops_the_collection_with_its_name(pytester):
    pytester.makepyfile(test_classified=BOTH, test_new="def test_something():\n    pass\n")
    result = pytester.runpytest("-p", "suite_rule")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_new.py: state which TensorFlows run it*pytest.mark.tf_builds*"])
    assert "test_classified.py" not in result.stderr.str()


def test_a_file_that_states_both_classes_is_refused(pytester):
    pytester.makepyfile(test_both="import pytest\npytestmark = [pytest.mark.tf_builds, pytest.mark.tf_independent]\n"
                                  "def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "suite_rule")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_both.py: state which TensorFlows run it*"])


def test_tf_builds_only_deselects_exactly_the_tests_that_run_once(pytester):
    pytester.makepyfile(test_kernels=BOTH, test_wording=ONCE)
    everything = pytester.runpytest("-p", "suite_rule", "-v")
    everything.assert_outcomes(passed=2)
    second_run = pytester.runpytest("-p", "suite_rule", "-v", "--tf-builds-only")
    second_run.assert_outcomes(passed=1, deselected=1)
    second_run.stdout.fnmatch_lines(["*test_kernels.py::test_kernels PASSED*"])
    assert "test_wording" not in second_run.stdout.str()

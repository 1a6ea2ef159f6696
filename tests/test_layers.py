"""The layers contracts (setup.cfg [importlinter]): imports point down only, checked by import-linter.

errors/system < config < ops, format < records, pipeline, cluster, model < train, bench < demo <
commands < cli; modules on one level never import each other (so pipeline never imports records).
Inside pipeline, its rooms: core < sources < stages < sequences < mixtures < checks < runtime < the
builder modules (plan, source_factory < data_errors, stage_assembly < builder).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def lint(root: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run([LINT_IMPORTS, "--config", os.path.join(root, "setup.cfg"), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_package_keeps_its_layers():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 kept, 0 broken" in result.stdout


def copy_with_import(tmp_path, module: str, imported: str) -> str:
    """A copy of the package and its setup.cfg where `module` (a path under tpu_pipeline/) also imports `imported`."""
    shutil.copytree(os.path.join(REPO, "tpu_pipeline"), tmp_path / "tpu_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "setup.cfg"), tmp_path / "setup.cfg")
    with open(tmp_path / "tpu_pipeline" / module, "a") as handle:
        handle.write(f"\nimport {imported}  # noqa: E402,F401  (an arrow pointing the wrong way)\n")
    return str(tmp_path)


def test_an_upward_import_breaks_the_contract(tmp_path):
    result = lint(copy_with_import(tmp_path, os.path.join("pipeline", "plan.py"), "tpu_pipeline.records.writer"))
    assert result.returncode != 0
    assert "tpu_pipeline.pipeline is not allowed to import tpu_pipeline.records" in result.stdout, result.stdout[-3000:]


def test_an_upward_import_between_the_pipelines_rooms_breaks_the_rooms_contract(tmp_path):
    result = lint(copy_with_import(tmp_path, os.path.join("pipeline", "core", "seeds.py"),
                                   "tpu_pipeline.pipeline.stages.base"))
    assert result.returncode != 0
    assert "1 kept, 1 broken" in result.stdout, result.stdout[-3000:]
    assert re.search(r"tpu_pipeline\.pipeline\.core is not allowed to import\s+tpu_pipeline\.pipeline\.stages",
                     result.stdout), result.stdout[-3000:]

"""The package's modules: no import circles, not even through an import inside a function, and none too long.

The layers contract (tests/test_layers.py) sees the arrows between sub-packages; inside one, two
modules that import each other (one of them lazily, inside a function, to get past the circle) are
one module in two files. This reads every import statement of `tpu_pipeline/` with `ast` (at module
level, inside functions and under `if TYPE_CHECKING:`) and fails on any circle of modules. A module
over `MAX_LINES` lines has usually grown a second job: split it by job.
"""
from __future__ import annotations

import ast
import os

import pytest

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tpu_pipeline"
MAX_LINES = 450

# Circles allowed, each with why (sorted module names); none is needed today.
ALLOWED_CIRCLES: set[tuple[str, ...]] = set()


def modules(root: str) -> dict[str, str]:
    """Module name → file, for every .py file of the package under `root`."""
    found = {}
    for directory, _, files in os.walk(os.path.join(root, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def imports(module: str, path: str, known: dict[str, str]) -> set[str]:
    """The package's modules that `module` imports anywhere in its file: `from a import b` names a.b
    when that is a module, else a (a package's __init__)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in known:
                    targets.add(name)
                elif base in known:
                    targets.add(base)
    targets.discard(module)
    return targets


def circles(root: str) -> list[tuple[str, ...]]:
    """The import circles (strongly connected groups of two or more modules), each sorted."""
    known = modules(root)
    graph = {module: imports(module, path, known) for module, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the package is a few hundred modules deep at most
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(tuple(sorted(group)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_one_that_imports_it_back():
    found = [group for group in circles(REPO) if group not in ALLOWED_CIRCLES]
    assert not found, "import circles (split out what both need, below both): " + "; ".join(
        " ↔ ".join(group) for group in found)


def test_the_check_sees_a_circle_through_an_import_inside_a_function(tmp_path):
    package = tmp_path / PACKAGE / "pipeline"
    package.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "builder.py").write_text("from tpu_pipeline.pipeline import errors\n")
    (package / "errors.py").write_text("def name():\n    from tpu_pipeline.pipeline.builder import source\n")
    assert circles(str(tmp_path)) == [("tpu_pipeline.pipeline.builder", "tpu_pipeline.pipeline.errors")]


def test_no_module_is_over_the_line_limit():
    long = {}
    for module, path in modules(REPO).items():
        with open(path, encoding="utf-8") as handle:
            lines = sum(1 for _ in handle)
        if lines > MAX_LINES:
            long[module] = lines
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"

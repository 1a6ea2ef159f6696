"""A hub README's `data_files` patterns match what `datasets` matches, and nothing below it.

`datasets.data_files.resolve_pattern` (fsspec's glob) is the rule: `*` stays within a folder, `**` as a
whole path component crosses folders (elsewhere it is refused), hidden names and `__special` folders
only where the pattern names them. The tree below has a config's files at the top beside another
config's sub-folder, hidden and underscore names, and deeper folders.
"""
from __future__ import annotations

import os

import datasets.data_files
import pytest

from tpu_pipeline.errors import DataError
from tpu_pipeline.records.tables.hub_layout import _glob, _walk, find_parquet

pytestmark = pytest.mark.tf_independent

TREE = ["main-a.parquet", "main-b.parquet", "_part.parquet", ".hidden.parquet", "extra/train-00000-of-00001.parquet",
        "extra/sub/deep.parquet", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet",
        "data/test-00000-of-00001.parquet", "_under/u.parquet", ".cache/c.parquet", "__special/s.parquet",
        "notes.txt", "data/readme.txt"]
PATTERNS = ["*.parquet", "*", "**", "**/*", "**/*.parquet", "data/*", "data/**", "data/**/*.parquet", "extra/*",
            "extra/**", "*/train-*", "**/train-*", "data/train-0000?-of-*.parquet", "data/[tv]*", "data/[!t]*",
            "main-[ab].parquet", "*/*/*", ".*", ".*/*", ".cache/*", "_under/*", "__special/*", "__*/*", "./data/*",
            "**.parquet", "data/**.parquet"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("hub")
    for name in TREE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")
    return str(root)


def hub_matches(root: str, pattern: str):
    """What datasets resolves the pattern to (the Parquet files), or 'refused'."""
    try:
        return sorted(os.path.relpath(path, root).replace(os.sep, "/")
                      for path in datasets.data_files.resolve_pattern(pattern, root) if path.endswith(".parquet"))
    except FileNotFoundError:
        return []
    except ValueError:
        return "refused"


def our_matches(root: str, pattern: str):
    try:
        return sorted(_glob(root, _walk(root, ".parquet", hidden=True), pattern))
    except DataError:
        return "refused"


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_matches_what_datasets_matches(tree, pattern):
    assert our_matches(tree, pattern) == hub_matches(tree, pattern)


def test_a_configs_top_level_files_leave_another_configs_sub_folder_alone(tree):
    with open(os.path.join(tree, "README.md"), "w") as handle:
        handle.write("---\nconfigs:\n- config_name: main\n  data_files: '*.parquet'\n  default: true\n"
                     "- config_name: extra\n  data_files:\n  - split: train\n    path: extra/**\n"
                     "- config_name: wrong\n  data_files: '**.parquet'\n---\n")
    try:
        main = find_parquet(tree, None)
        assert main.config == "main" and main.splits == {"train": ["_part.parquet", "main-a.parquet", "main-b.parquet"]}
        assert find_parquet(tree, "extra").splits == {"train": ["extra/sub/deep.parquet",
                                                                "extra/train-00000-of-00001.parquet"]}
        with pytest.raises(DataError, match=r"'\*\*' can only be a whole path component \(data/\*\*, \*\*/\*\.parquet\)"):
            find_parquet(tree, "wrong")
    finally:
        os.remove(os.path.join(tree, "README.md"))


def test_files_found_without_a_readme_leave_out_what_datasets_leaves_out(tree):
    assert _walk(tree, ".parquet") == [f for f in sorted(TREE) if f.endswith(".parquet") and not f.startswith((".", "__"))]

"""The guides' `train` commands never share a run directory between runs of other data, models or tasks.

A reader runs the commands of a guide one after the other; two that train on other data (or another
model, task, sequence shape or global batch) into the same `train.run_dir` would be refused on the
second (a run directory resumes only what it was started with). The same command twice (a resume)
and changes a resume accepts (more epochs, logging) may share one.
"""
from __future__ import annotations

import collections
import glob
import os
import re
import shlex

import pytest
import yaml

from tpu_pipeline.config.identity import IDENTITY_KEYS

pytestmark = pytest.mark.tf_independent

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
TRAIN = re.compile(r"^(?:\.venv/bin/)?tpu-pipeline train\b|^bash scripts/run_demo\.sh\b")


def commands() -> list[tuple[str, str]]:
    """(where, command) of every train command: lines of ```bash blocks and inline `code` spans."""
    found = []
    for path in DOCS:
        in_bash = False
        for number, line in enumerate(open(path).read().split("\n"), 1):
            where = f"{os.path.relpath(path, REPO)}:{number}"
            if line.startswith("```"):
                in_bash = line.strip() == "```bash" and not in_bash
                continue
            if in_bash:
                if TRAIN.match(line.strip()):
                    found.append((where, line.strip()))
                continue
            found += [(where, span) for span in re.findall(r"`([^`]+)`", line) if TRAIN.match(span)]
    return found


def compared(key: str) -> bool:
    """Whether an override sets a key (or a section of keys) a resume compares."""
    return any(key == k or k.startswith(key + ".") or key.startswith(k + ".") for k in IDENTITY_KEYS)


def run_of(command: str):
    """(run_dir, config, the overrides a resume compares) of one command; None for a reader's own config."""
    words = [w for w in shlex.split(command, comments=True) if w not in ("...", "[key=value")]
    config = None
    if "--config" in words:
        config = words[words.index("--config") + 1]
        if not os.path.exists(os.path.join(REPO, config)):
            return None  # the reader's config (c.yaml): its run_dir is theirs
    overrides = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    if "train.run_dir" in overrides:
        run_dir = overrides.pop("train.run_dir")
    else:
        raw = yaml.safe_load(open(os.path.join(REPO, config or "configs/demo.yaml")))
        run_dir = raw["train"]["run_dir"]
    return run_dir, config, tuple(sorted((k, v) for k, v in overrides.items() if compared(k)))


def test_the_guides_train_commands_never_share_a_run_dir_between_other_runs():
    found = commands()
    assert any("configs/text_lm.yaml" in command for _, command in found), "no train command found"
    runs = collections.defaultdict(list)
    for where, command in found:
        run = run_of(command)
        if run is not None:
            runs[run[0]].append((run[1:], where, command))
    shared = {run_dir: uses for run_dir, uses in runs.items() if len({what for what, _, _ in uses}) > 1}
    assert not shared, "\n".join(
        f"train.run_dir={run_dir} is shared by commands of other runs:\n" + "\n".join(f"  {where}: {command}"
                                                                                   for _, where, command in uses)
        for run_dir, uses in shared.items())

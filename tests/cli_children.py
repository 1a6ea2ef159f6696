"""The `tpu-pipeline` child processes that tests/test_cli.py and tests/test_cli_habits.py check, for those
two files alone. Each child imports TensorFlow (most of its seconds), so a child whose output several
assertions read runs once for all of them (functools.lru_cache, per demo cache), and children that share
nothing run together (helpers.run_together, each with its own environment: one's start-up overlaps
another's). Where a test is about a command's words and exit code, not about the process (TensorFlow's
start-up, native log lines, devices set up at start), `in_process` runs the real entry point in the test
process instead, as tests/test_verify_tokens.py does.

Every command without --config writes the demo data set on first use (not atomically): children that may
write it start only once it is there, except the one test_cli.py checks writing it.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpu_pipeline.cli", *args]


def environment(cache_dir: str, quiet: bool = False, **extra: str) -> dict:
    """The test process's environment for a child, with the demo cache; `quiet`: without
    TF_CPP_MIN_LOG_LEVEL (the conftest sets it; a user who has not set it gets the CLI's silencing)."""
    env = {**os.environ, "TPU_PIPELINE_CACHE": cache_dir, "PYTHONPATH": REPO, **extra}
    if quiet:
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    return env


def together(runs: Sequence[tuple[list[str], dict]], cwd: str = REPO) -> list:
    """(command, env) pairs run at the same time (helpers.run_together); their CompletedProcesses in order."""
    from helpers import run_together

    return run_together([args for args, _ in runs], TIMEOUT, envs=[env for _, env in runs], cwd=cwd)


def in_process(capsys, monkeypatch, cache_dir: str, *args: str) -> tuple[int, str, str]:
    """`tpu-pipeline ARGS` through tpu_pipeline.cli.main in this process: (exit code, stdout, stderr).
    The absl flags are reset after it (--config is a multi-flag: a later call would layer this one's)."""
    from absl import flags

    from tpu_pipeline.cli import main

    monkeypatch.setenv("TPU_PIPELINE_CACHE", cache_dir)
    capsys.readouterr()
    try:
        main(["tpu-pipeline", *args])
        code = 0
    except SystemExit as exit_:
        code = 0 if exit_.code is None else exit_.code
    finally:
        flags.FLAGS.unparse_flags()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@functools.lru_cache(maxsize=None)
def demo_data(cache_dir: str) -> str:
    """The demo set in `cache_dir` (written here, in-process, if no child wrote it yet)."""
    from tpu_pipeline.records import ensure_demo_dataset

    return ensure_demo_dataset(cache_dir)


@functools.lru_cache(maxsize=None)
def help_runs(cache_dir: str) -> tuple:
    """(`train --help` with TF_CPP_MIN_LOG_LEVEL unset: the short help, which must come with none of
    TensorFlow's native log lines; `doctor --helpfull` with TF_CPP_MIN_LOG_LEVEL=0: the full help, and the
    user's own setting obeyed: the native lines come). Neither writes the demo data; both run from outside
    the repository (the cache directory)."""
    quiet, loud = together([(command("train", "--help"), environment(cache_dir, quiet=True)),
                            (command("doctor", "--helpfull"), environment(cache_dir, TF_CPP_MIN_LOG_LEVEL="0"))],
                           cwd=cache_dir)
    return quiet, loud


@functools.lru_cache(maxsize=None)
def first_demo(cache_dir: str):
    """`demo --steps 20 --warmup 2` with TF_CPP_MIN_LOG_LEVEL unset: the run that writes the demo data
    (test_cli.py checks it), and a command that must print none of TensorFlow's native log lines."""
    (result,) = together([(command("demo", "--steps", "20", "--warmup", "2"), environment(cache_dir, quiet=True))])
    return result

"""The `tpu-pipeline` command line, run as a user would (a subprocess, real files)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from cli_children import first_demo, help_runs, in_process

pytestmark = pytest.mark.tf_independent


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(*args: str, cache_dir: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TPU_PIPELINE_CACHE": cache_dir}
    return subprocess.run(
        [sys.executable, "-m", "tpu_pipeline.cli", *args], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=300,
    )


def test_demo_builds_the_pipeline_and_prints_throughput(demo_cache):
    result = first_demo(demo_cache)  # `demo --steps 20 --warmup 2`, a child (tests/cli_children.py)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TensorSpec(shape=(128, 64, 64, 3), dtype=tf.float32" in result.stdout
    match = re.search(r"throughput: ([\d,]+) examples/s, ([\d.,]+) batches/s \((\d+) batches", result.stdout)
    assert match and int(match.group(3)) == 20 and float(match.group(1).replace(",", "")) > 0
    files = sorted(os.listdir(os.path.join(demo_cache, "demo_shapes", "v1-64px-4096-1024")))
    assert files[0] == "metadata.json" and len([f for f in files if f.startswith("train-")]) == 8


def test_overrides_and_user_errors_are_one_clear_line(demo_cache, capsys, monkeypatch):
    # The entry point in this process (tests/cli_children.py): what an override and a user error do, their
    # words and exit codes; a real process's demo run and one-line error are the tests around this one's.
    code, stdout, stderr = in_process(capsys, monkeypatch, demo_cache, "demo", "--steps", "2", "--warmup", "0",
                                      "data.batch_size=64")
    assert code == 0 and "shape=(64, 64, 64, 3)" in stdout, stderr[-2000:]
    code, _, stderr = in_process(capsys, monkeypatch, demo_cache, "demo", "data.shuffle.buffer=3")
    assert code == 2
    assert "data.shuffle.buffer: unknown key" in stderr
    assert "Traceback" not in stderr


def test_usage_and_unknown_command(demo_cache):
    assert "commands:" in cli("--help", cache_dir=demo_cache).stdout
    result = cli("frobnicate", cache_dir=demo_cache)
    assert result.returncode == 2 and "unknown command 'frobnicate'" in result.stderr


def test_commands_are_quiet_unless_asked(demo_cache):
    """With TF_CPP_MIN_LOG_LEVEL unset, `train --help` and a demo run print none of TensorFlow's native log
    lines; set by the user (0), they come. The children are shared (tests/cli_children.py): the quiet demo is
    test_demo_builds_the_pipeline_and_prints_throughput's, the loud one test_cli_habits' `doctor --helpfull`."""
    native = re.compile(r"^[IWEF]\d{4} |WARNING: All log messages before absl|cpu_feature_guard|Sharding callback", re.M)
    # Where neither ran yet (this test alone), the help runs (which write no demo data) and the demo together.
    with ThreadPoolExecutor(2) as pool:
        helps, first = pool.submit(help_runs, demo_cache), pool.submit(first_demo, demo_cache)
        (quiet, loud), demo = helps.result(), first.result()  # the demo: run with TF_CPP_MIN_LOG_LEVEL unset
    assert "--helpfull" in quiet.stdout and not native.search(quiet.stdout + quiet.stderr), quiet.stderr[:2000]
    assert demo.returncode == 0 and not native.search(demo.stdout + demo.stderr), demo.stderr[:2000]
    assert native.search(loud.stdout + loud.stderr)  # the user's own setting is obeyed


def test_demo_on_data_that_ends_during_the_warm_up_is_one_line(demo_cache):
    """A one-pass config (data.repeat: 1, the default) over little data ran out during the warm-up and
    left a bare StopIteration traceback."""
    result = cli("demo", "--warmup", "1000", "--steps", "2", "data.repeat=1", cache_dir=demo_cache)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "the pipeline ended after" in result.stderr and "set data.repeat=forever" in result.stderr
    assert "Traceback" not in result.stderr

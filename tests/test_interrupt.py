"""Ctrl-C in any command is one line saying what was kept (issue 25, item 5), never a trace.

Each test starts a real `tpu-pipeline` child process, waits until it is doing its work, sends it a real
SIGINT (what Ctrl-C sends) and reads what it printed: exit status 130, no Python traceback, and one
`tpu-pipeline COMMAND: interrupted (Ctrl-C): ...` line that matches what is on disk.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from test_convert import REPO, make_image_folder
from tpu_pipeline.records import read_metadata
from tpu_pipeline.records.convert import STATE_DIR
from tpu_pipeline.records.shard_pause import SHARD_DELAY_ENV

pytestmark = pytest.mark.tf_independent

PREFIX = "tpu-pipeline {}: interrupted (Ctrl-C): "


# `python -m tpu_pipeline.cli` as a terminal starts it: SIGINT raising KeyboardInterrupt. A test run started
# in the background of a shell without job control (`bash .ci/run &` in a script) ignores SIGINT, a child
# inherits that, and Python leaves an ignored SIGINT ignored: Ctrl-C would never reach the command.
AS_FROM_A_TERMINAL = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                      "runpy.run_module('tpu_pipeline.cli', run_name='__main__', alter_sys=True)")


def start(command: str, args: list[str], log_path, env: dict | None = None) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, command, *args], cwd=REPO,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stdout=log,
                            stderr=subprocess.STDOUT)


def wait_until(process: subprocess.Popen, ready, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if ready():
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail(f"the child ended (status {process.poll()}) or timed out before {what}")


def interrupt(process: subprocess.Popen, log_path) -> str:
    """SIGINT (Ctrl-C) to the child; its whole output after it exits with 130."""
    process.send_signal(signal.SIGINT)
    try:
        status = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    output = open(log_path).read()
    assert status == 130, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    return output


def the_line(output: str, command: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(PREFIX.format(command))]
    assert len(lines) == 1, output[-3000:]
    assert output.rstrip().splitlines()[-1] == lines[0], output[-3000:]  # the last thing it says
    return lines[0][len(PREFIX.format(command)):]


def test_ctrl_c_in_convert_says_which_shards_are_kept_and_the_rerun_finishes(tmp_path):
    make_image_folder(tmp_path / "images", per_class=6)  # 18 images, one per shard
    out = tmp_path / "out"
    args = ["--from", "image-folder", str(tmp_path / "images"), "--out", str(out), "--target_shard_mb", "0.001",
            "--min_shards", "1", "--workers", "1", "--noprogress"]
    state = out / STATE_DIR
    child = start("convert", args, tmp_path / "convert.log", {SHARD_DELAY_ENV: "0.5"})
    wait_until(child, lambda: len(list(state.glob("*.tfrecord.json"))) >= 2, "two shards were finished")
    kept = the_line(interrupt(child, tmp_path / "convert.log"), "convert")

    done = sorted(p.name[:-len(".json")] for p in state.glob("*.tfrecord.json") if (state / p.name[:-5]).exists())
    assert kept == (f"{len(done)} of 18 shard(s) finished and kept in {state}; run the same command again to write "
                    "the rest (no metadata.json yet, so nothing reads it as a dataset)"), kept
    assert 2 <= len(done) < 18 and read_metadata(str(out)) is None

    rerun = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"wrote {18 - len(done)} shard(s), kept {len(done)} from the interrupted run" in rerun.stdout, rerun.stdout
    assert read_metadata(str(out))["splits"]["train"]["num_examples"] == 18


def test_ctrl_c_in_demo_says_nothing_was_written(tmp_path, demo_cache):
    log = tmp_path / "demo.log"
    child = start("demo", ["--steps", "100000000", "--warmup", "1", "data.repeat=forever"], log,
                  {"TPU_PIPELINE_CACHE": demo_cache})
    wait_until(child, lambda: "element spec:" in open(log).read(), "the demo started timing")
    time.sleep(3.0)  # inside the timed loop (one tf.function call would hold a Ctrl-C until it ends)
    kept = the_line(interrupt(child, log), "demo")
    assert kept == "nothing was written (this command writes its results only when it finishes)", kept


@pytest.mark.slow
def test_ctrl_c_in_train_saves_at_the_next_step_and_says_so(tmp_path, small_demo_dir):
    """Issue 47 item 6: a Ctrl-C lost every step since the last checkpoint. The first one now saves at the next
    step, stops as a SIGTERM does and exits 130; a second one quits at once (test_train.py, in process)."""
    run_dir = tmp_path / "run"
    log = tmp_path / "train.log"
    overrides = [f"data.source.dir={small_demo_dir}", f"eval_data.source.dir={small_demo_dir}",
                 "data.preprocess.1.size=32", "eval_data.preprocess.1.size=32", "data.batch_size=32",
                 "eval_data.batch_size=32", f"train.run_dir={run_dir}", "train.epochs=1000",
                 "train.checkpoint_every_steps=1000", "train.log_every_steps=2"]
    child = start("train", ["--config", os.path.join(REPO, "configs", "demo.yaml"), *overrides], log)
    wait_until(child, lambda: "step 2/" in open(log).read(), "a step was logged")
    output = interrupt(child, log)
    assert "Ctrl-C: saving a checkpoint after this step, then stopping" in output, output[-3000:]
    stopped = [line for line in output.splitlines() if line.startswith("stopped by Ctrl-C at step ")]
    assert len(stopped) == 1 and "start the same command again to resume" in stopped[0], output[-3000:]
    step = int(stopped[0].split()[5])
    latest = tf.train.latest_checkpoint(str(run_dir / "checkpoints"))
    assert step >= 2 and latest is not None and latest.endswith(f"ckpt-{step}"), (latest, stopped)
    assert f"saved checkpoint {latest} at step {step} (Ctrl-C)" in output, output[-3000:]


@pytest.fixture(scope="module")
def small_demo_dir(tmp_path_factory) -> str:
    from tpu_pipeline.records import ensure_demo_dataset

    return ensure_demo_dataset(str(tmp_path_factory.mktemp("small")), num_train=256, num_eval=64, size=32,
                               num_shards=4)

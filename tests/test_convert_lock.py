"""The lock `convert` takes on --out, and the guarantee that a failed run writes no metadata.json.

Two converts into one directory once interleaved their shards and both wrote metadata.json: a
"finished" dataset holding some images twice and others not at all. These tests run real converts
(in this process and as real CLI processes) against real files.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

from test_convert import FAST, REPO, make_image_folder, read_split
from tpu_pipeline.errors import DataError
from tpu_pipeline.records import ConvertOptions, convert, read_metadata
from tpu_pipeline.records.convert import STATE_DIR
from tpu_pipeline.records.shard_pause import SHARD_DELAY_ENV, SHARD_HOLD_ENV
from tpu_pipeline.records.image_folder import ImageFolderSource
from tpu_pipeline.records.out_lock import LOCK_FILE, out_lock

pytestmark = pytest.mark.tf_independent

MANY_SHARDS = dict(target_shard_mb=0.001, min_shards=1)  # one image per shard: many shard boundaries


def write_lock(out, host: str, pid: int, since: str = "2020-01-02T03:04:05Z") -> str:
    """A lock file as another convert would have left it."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(str(out), LOCK_FILE)
    with open(path, "w") as handle:
        json.dump({"host": host, "pid": pid, "since": since, "token": "theirs"}, handle)
    return path


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def filenames(out) -> list[str]:
    """Every image path in the dataset, over all splits (duplicates kept, to catch them)."""
    metadata = read_metadata(str(out))
    return sorted(e["filename"].decode() for split in metadata["splits"] for e in read_split(out, split))


def test_a_held_lock_refuses_at_once_and_touches_nothing(tmp_path):
    make_image_folder(tmp_path / "images", per_class=2)
    out = str(tmp_path / "out")
    source = ImageFolderSource(str(tmp_path / "images"))
    with out_lock(out) as holder:
        with pytest.raises(DataError) as error:  # at once: it neither waits nor writes anything
            convert(source, out, ConvertOptions(**FAST))
        assert sorted(os.listdir(out)) == [LOCK_FILE]  # no plan, no _incomplete/, no metadata.json
    lock = os.path.join(out, LOCK_FILE)
    assert str(error.value) == (
        f"--out {out} is in use by a convert on host {socket.gethostname()}, pid {os.getpid()}, since "
        f"{holder.since}; wait for it to finish, or stop it; if no convert is running, delete {lock}"
    )
    assert "\n" not in str(error.value)
    assert not os.path.exists(lock)  # released on leaving the block
    assert convert(source, out, ConvertOptions(**FAST)).metadata["splits"]["train"]["num_examples"] == 6
    assert not os.path.exists(lock)


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    make_image_folder(tmp_path / "images", per_class=1)
    out = str(tmp_path / "out")
    lock = write_lock(out, "other-host-7", dead_pid())
    with pytest.raises(DataError) as error:
        convert(ImageFolderSource(str(tmp_path / "images")), out, ConvertOptions(**FAST))
    assert str(error.value) == (
        f"--out {out} is in use by a convert on host other-host-7, pid {json.load(open(lock))['pid']}, since "
        "2020-01-02T03:04:05Z (another host: not taken over automatically); wait for it to finish, or stop it; "
        f"if no convert is running on other-host-7, delete {lock}"
    )
    assert json.load(open(lock))["token"] == "theirs"  # left as it was
    assert read_metadata(out) is None


def test_a_lock_naming_no_holder_refuses(tmp_path):
    make_image_folder(tmp_path / "images", per_class=1)
    out = str(tmp_path / "out")
    os.makedirs(out)
    lock = os.path.join(out, LOCK_FILE)
    open(lock, "w").close()  # a run killed between creating the file and writing it
    with pytest.raises(DataError, match=f"which names no holder.*if no convert is running, delete {lock}$"):
        convert(ImageFolderSource(str(tmp_path / "images")), out, ConvertOptions(**FAST))
    os.remove(lock)
    assert convert(ImageFolderSource(str(tmp_path / "images")), out, ConvertOptions(**FAST)).metadata


def test_a_lock_left_by_a_dead_process_of_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    expected = make_image_folder(tmp_path / "images", per_class=3)
    out = str(tmp_path / "out")
    pid = dead_pid()
    lock = write_lock(out, socket.gethostname(), pid)
    with caplog.at_level(logging.WARNING):
        result = convert(ImageFolderSource(str(tmp_path / "images")), out, ConvertOptions(**FAST))
    assert f"--out {out}: taking over {lock}, left by a convert that is no longer running (host " \
           f"{socket.gethostname()}, pid {pid}, since 2020-01-02T03:04:05Z)" in caplog.text
    assert result.metadata["splits"]["train"]["num_examples"] == 9
    assert filenames(out) == sorted(expected)
    assert not os.path.exists(lock)


def test_racing_takeovers_of_a_stale_lock_let_exactly_one_run_in(tmp_path):
    out = str(tmp_path / "out")
    write_lock(out, socket.gethostname(), dead_pid())
    barrier, inside, refused = threading.Barrier(8), [], []

    def race() -> None:
        barrier.wait()
        try:
            with out_lock(out):
                inside.append(1)
                time.sleep(0.5)  # hold it while the others try
        except DataError:
            refused.append(1)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Same pid for every thread: the first in holds a live lock, every later one is refused.
    assert len(inside) == 1 and len(refused) == 7
    assert os.listdir(out) == []


def test_the_best_effort_lock_on_tf_gfile_paths(tmp_path):
    out = f"ram://lock-test-{os.getpid()}/out"  # TensorFlow's in-memory file system stands in for gs://
    with out_lock(out):
        with pytest.raises(DataError, match=f"in use by a convert on host .*, pid {os.getpid()}, .*delete {out}/{LOCK_FILE}"):
            with out_lock(out):
                pass
    assert tf.io.gfile.listdir(out) == []
    lock = f"{out}/{LOCK_FILE}"
    with tf.io.gfile.GFile(lock, "w") as handle:
        handle.write(json.dumps({"host": socket.gethostname(), "pid": dead_pid(), "since": "x", "token": "t"}))
    with out_lock(out):  # a dead holder of this host: taken over
        assert json.loads(tf.io.gfile.GFile(lock).read())["pid"] == os.getpid()


class FailingSource(ImageFolderSource):
    """An image folder whose `encode` crashes (not an ItemError) on the k-th item: a bug mid-write."""

    def __init__(self, root: str, fail_at: int) -> None:
        super().__init__(root)
        self.fail_at, self.calls, self.guard = fail_at, 0, threading.Lock()

    def encode(self, item):
        with self.guard:
            self.calls += 1
            crash = self.calls == self.fail_at
        if crash:
            raise RuntimeError("boom: simulated crash mid-write")
        return super().encode(item)


def test_a_convert_that_fails_mid_write_leaves_no_metadata_and_the_rerun_completes(tmp_path):
    expected = make_image_folder(tmp_path / "images", per_class=4)
    out = tmp_path / "out"
    options = ConvertOptions(**MANY_SHARDS, progress=False, workers=1)
    with pytest.raises(RuntimeError, match="boom"):
        convert(FailingSource(str(tmp_path / "images"), fail_at=7), str(out), options)
    assert read_metadata(str(out)) is None and not (out / "metadata.json").exists()
    assert not list(out.glob("*.tfrecord*")), "a failed run must not leave shards under final names"
    assert not (out / LOCK_FILE).exists()  # released in the finally
    finished = len(list((out / STATE_DIR).glob("*.tfrecord.json")))
    assert 1 <= finished < 12
    result = convert(ImageFolderSource(str(tmp_path / "images")), str(out), options)
    assert result.shards_reused == finished and result.shards_written == 12 - finished
    assert filenames(out) == sorted(expected)  # every image exactly once
    assert sorted(os.listdir(out)) == sorted(["metadata.json"] + result.metadata["splits"]["train"]["files"])


def start_cli(args: list[str], log_path, env: dict | None = None) -> subprocess.Popen:
    log = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                            env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)


def wait_for_shards(process: subprocess.Popen, out, count: int) -> None:
    """Returns once `process` holds the lock and has finished `count` shards (fails if it ended first)."""
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if (out / LOCK_FILE).exists() and len(list((out / STATE_DIR).glob("*.tfrecord.json"))) >= count:
            return
        time.sleep(0.05)
    pytest.fail("the first conversion ended (or never started) before the test could act on it")


@pytest.mark.slow
def test_a_second_concurrent_convert_cli_refuses_and_the_first_finishes(tmp_path):
    expected = make_image_folder(tmp_path / "images", per_class=8)
    out = tmp_path / "out"
    common = ["--from", "image-folder", str(tmp_path / "images"), "--out", str(out), "--target_shard_mb", "0.001",
              "--min_shards", "1", "--workers", "2", "--noprogress"]
    hold = tmp_path / "hold"  # the first conversion waits after each shard while this file exists
    hold.touch()
    first = start_cli(common + ["--seed", "1"], tmp_path / "first.log", {SHARD_HOLD_ENV: str(hold)})
    try:
        wait_for_shards(first, out, 1)
        second = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *common, "--seed", "2"],
                                cwd=REPO, capture_output=True, text=True, timeout=300)
        assert first.poll() is None, "the first conversion must still run while the second is refused"
        hold.unlink()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    lock = out / LOCK_FILE
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    error = [line for line in second.stderr.splitlines() if line.startswith("tpu-pipeline convert: error:")]
    assert error == [
        f"tpu-pipeline convert: error: --out {out} is in use by a convert on host {socket.gethostname()}, "
        f"pid {first.pid}, since {error[0].split('since ')[1].split(';')[0]}; wait for it to finish, or stop it; "
        f"if no convert is running, delete {lock}"
    ]
    metadata = read_metadata(str(out))
    assert metadata["source"]["seed"] == 1 and metadata["splits"]["train"]["num_examples"] == 24
    assert filenames(out) == sorted(expected)  # every image exactly once
    assert not lock.exists() and not (out / STATE_DIR).exists()


@pytest.mark.slow
def test_a_killed_convert_cli_leaves_a_stale_lock_that_the_rerun_takes_over(tmp_path):
    expected = make_image_folder(tmp_path / "images", per_class=8)
    out = tmp_path / "out"
    args = ["--from", "image-folder", str(tmp_path / "images"), "--out", str(out), "--target_shard_mb", "0.001",
            "--min_shards", "1", "--workers", "2", "--noprogress"]
    first = start_cli(args, tmp_path / "killed.log", {SHARD_DELAY_ENV: "0.4"})
    try:
        wait_for_shards(first, out, 3)
    finally:
        first.send_signal(signal.SIGKILL)  # no finally runs, as on a preempted VM: the lock stays
        first.wait()
    holder = json.loads((out / LOCK_FILE).read_text())
    assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
    assert read_metadata(str(out)) is None
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", "convert", *args], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (f"--out {out}: taking over {out / LOCK_FILE}, left by a convert that is no longer running "
            f"(host {socket.gethostname()}, pid {first.pid}, since {holder['since']})") in result.stderr
    assert "kept " in result.stdout  # resumed: the killed run's finished shards were kept
    assert filenames(out) == sorted(expected)
    assert not (out / LOCK_FILE).exists()

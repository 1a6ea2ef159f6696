"""Two real TF_CONFIG workers on loopback sharing one run_dir, as hosts share a gs:// path: one is
killed, both start again, one gets SIGTERM, one host alone resumes (the rest of the epoch dealt to it) and
is killed, both start again; the run ends with one metrics.json,
the ids of every epoch across both workers are the dataset exactly, and logged metrics are true
values, not sums over the workers.

Slow (two TensorFlow processes per round): `pytest -m "not slow"` skips it locally; CI runs it.
"""
from __future__ import annotations

import glob
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import pytest

from test_preemption import CHILD, ENV, REPO, assert_exact_epochs, max_step, read_log, train_config

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]

EPOCHS, STEPS_PER_EPOCH, NUM = 3, 8, 512  # 512 examples, global batch 64


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_workers(config_path: str, out_dir: str) -> list[subprocess.Popen]:
    """Two `train` processes of one TF_CONFIG cluster (fresh ports: a restarted cluster is a new one)."""
    addresses = [f"localhost:{port}" for port in free_ports(2)]
    workers = []
    for index in range(2):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        env = {**ENV, "TF_CONFIG": json.dumps(tf_config), "IDS_LOG": f"ids-{index}.log"}
        workers.append(subprocess.Popen([sys.executable, CHILD, "train", config_path, out_dir], cwd=REPO, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return workers


def wait_for_step(workers: list[subprocess.Popen], out_dir: str, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while max_step(out_dir) < step:
        assert all(w.poll() is None for w in workers), "a worker ended before the step:\n" + outputs(workers)
        assert time.monotonic() < deadline, "the workers made no progress:\n" + outputs(workers)
        time.sleep(0.05)


def finish(workers: list[subprocess.Popen], timeout: float = 240) -> list[str]:
    return [w.communicate(timeout=timeout)[0] for w in workers]


def outputs(workers: list[subprocess.Popen]) -> str:
    for w in workers:
        if w.poll() is None:
            w.kill()
    return "\n----\n".join(w.communicate()[0][-3000:] for w in workers)


def kill_after_its_first_checkpoint(process: subprocess.Popen, run_dir: str, resumed_from: int) -> int:
    """SIGKILLs `process`, a run resumed from step `resumed_from`, once it wrote a checkpoint; returns the step the
    next run resumes from. Keyed on the checkpoint state file, which a resume reads: a `.index` file exists before
    the state file names it, and a kill between the two leaves the older checkpoint the newest."""
    deadline = time.monotonic() + 240
    while newest_checkpoint_step(run_dir) == resumed_from:
        assert process.poll() is None and time.monotonic() < deadline, outputs([process])
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    return newest_checkpoint_step(run_dir)


def newest_checkpoint_step(run_dir: str) -> int:
    """The step of the checkpoint the state file `checkpoints/checkpoint` names (written by rename: never half)."""
    text = open(os.path.join(run_dir, "checkpoints", "checkpoint")).read()
    return int(re.search(r'^model_checkpoint_path: "(?:.*/)?ckpt-(\d+)"', text, re.M).group(1))


def drop_steps_after(log: str, step: int) -> None:
    """Keeps the ids logged for the steps before `step` only: a killed run's steps after its last checkpoint,
    trained again by the run that resumes from it (on another number of hosts, on other halves of the batch)."""
    kept = [line for line in open(log).read().splitlines() if line.split() and int(line.split()[0]) < step]
    open(log, "w").write("".join(line + "\n" for line in kept))


def dealt_line(hosts: int, was: int, step: int, to: str, replicas: int = 2) -> str:
    """What `train` says resuming at `step` on `hosts` hosts from a checkpoint of `was` hosts (a global batch
    of 64, epochs of 8 steps)."""
    per_epoch = NUM // 64
    head = (f"this run has {hosts} host{'s' * (hosts > 1)} ({replicas} replicas), the checkpoint {was} "
            f"host{'s' * (was > 1)}: ")
    if step % per_epoch == 0:
        return head + f"each input pipeline starts its own shard of data epoch {step // per_epoch + 1}"
    left = NUM - (step % per_epoch) * 64
    return head + f"the rest of data epoch {step // per_epoch + 1}, {left:,} examples, is dealt to {to}, then each reads its own shard"


def two_then_one_then_two(raw: dict, tmp_path, start: Callable[[str, str], list[subprocess.Popen]], mode: str,
                          killed: Callable[[int, str], None]) -> list[str]:
    """Issue 51's round of slices for `raw` (its train.run_dir; ids logged under tmp_path/out): two TF_CONFIG workers
    (`start(config_path, out_dir)`) get SIGTERM past step 5; one host of 2 replicas (child `mode`) resumes with a
    checkpoint each step and is SIGKILLed after its first, the steps it trained after that dropped from its ids log;
    `killed(the step of its checkpoint, what it printed)` checks them; two workers resume from that and finish.
    Returns what the two printed at the end."""
    run_dir, out_dir = raw["train"]["run_dir"], str(tmp_path / "out")
    raw = {**raw, "cluster": {}}  # TF_CONFIG decides: MultiWorkerMirroredStrategy, one replica per worker
    config_path = str(tmp_path / "config.json")
    json.dump(raw, open(config_path, "w"))
    workers = start(config_path, out_dir)
    wait_for_step(workers, out_dir, 5)
    workers[1].send_signal(signal.SIGTERM)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [143, 143], "\n----\n".join(p[-3000:] for p in printed)
    sigterm_step = max(int(name.split("-")[1].split(".")[0])
                       for name in os.listdir(os.path.join(run_dir, "checkpoints")) if name.endswith(".index"))

    alone_path = str(tmp_path / "alone.json")
    json.dump({**raw, "cluster": {"cpu_replicas": 2}, "train": {**raw["train"], "checkpoint_every_steps": 1}},
              open(alone_path, "w"))
    alone = subprocess.Popen([sys.executable, CHILD, mode, alone_path, out_dir], cwd=REPO,
                             env={**ENV, "IDS_LOG": "ids-alone.log"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    resumed_at = kill_after_its_first_checkpoint(alone, run_dir, sigterm_step)
    said = alone.communicate(timeout=60)[0]
    drop_steps_after(os.path.join(out_dir, "ids-alone.log"), resumed_at)
    killed(resumed_at, said)

    workers = start(config_path, out_dir)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(p[-3000:] for p in printed)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == resumed_at, metrics
    return printed


def agreed_sigterm_step(printed: list[str], run_dir: str) -> int:
    """The one step at which every process said it stopped on SIGTERM, its checkpoint written."""
    stops = [[line for line in p.splitlines() if "stopped by SIGTERM at step" in line] for p in printed]
    assert all(stops), "\n----\n".join(p[-3000:] for p in printed)
    stop_steps = {int(s[0].split("at step ")[1].split()[0]) for s in stops}
    assert len(stop_steps) == 1, stops
    sigterm_step = stop_steps.pop()
    assert os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{sigterm_step}.index"))
    return sigterm_step


def test_two_workers_with_a_shared_run_dir_resume_exactly_after_a_kill_and_a_sigterm(tmp_path):
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    data_dir = ensure_demo_dataset(str(tmp_path / "data"), num_train=NUM, num_eval=64, size=16, num_shards=8)
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    config = train_config(data_dir, run_dir)
    config["cluster"] = {}  # TF_CONFIG decides: MultiWorkerMirroredStrategy, one replica per worker
    config["train"].update(epochs=EPOCHS, checkpoint_every_steps=3)
    config_path = str(tmp_path / "config.json")
    json.dump(config, open(config_path, "w"))
    steps = EPOCHS * STEPS_PER_EPOCH
    rng = random.Random(11)

    # 1. A worker dies (SIGKILL) mid-run; its peer cannot go on alone: it stops with one line that
    # says to start every worker again.
    workers = start_workers(config_path, out_dir)
    wait_for_step(workers, out_dir, rng.randint(4, 9))
    workers[1].send_signal(signal.SIGKILL)
    printed = finish(workers, timeout=120)
    assert workers[0].returncode == 2, printed[0][-3000:]
    assert "a peer worker stopped or cannot be reached" in printed[0] and "start every worker again" in printed[0]
    assert "Traceback" not in printed[0], printed[0][-3000:]
    assert not os.path.exists(os.path.join(run_dir, "metrics.json"))
    killed_at = max_step(out_dir)

    # 2. Both start again and resume from the chief's newest checkpoint; then only the non-chief
    # gets SIGTERM: both must save the same step and exit 143.
    workers = start_workers(config_path, out_dir)
    wait_for_step(workers, out_dir, killed_at + rng.randint(2, 4))
    workers[1].send_signal(signal.SIGTERM)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [143, 143], "\n----\n".join(p[-3000:] for p in printed)
    resumed = [line for line in printed[0].splitlines() if line.startswith("resumed from")]
    assert resumed and 0 < int(resumed[0].split("step ")[1].split()[0]) <= killed_at, printed[0][-3000:]
    sigterm_step = agreed_sigterm_step(printed, run_dir)

    # 2b. The same command on one host of 2 replicas (a slice that came back smaller): the rest of the epoch
    # the two workers were in is dealt to it, then it reads its own shard; it is SIGKILLed after a checkpoint.
    alone_config = str(tmp_path / "alone.json")
    json.dump({**config, "cluster": {"cpu_replicas": 2}, "train": {**config["train"], "checkpoint_every_steps": 1}},
              open(alone_config, "w"))  # a checkpoint each step: it is killed inside the dealt remainder
    alone = subprocess.Popen([sys.executable, CHILD, "train", alone_config, out_dir], cwd=REPO,
                             env={**ENV, "IDS_LOG": "ids-alone.log"}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    resumed_at = kill_after_its_first_checkpoint(alone, run_dir, sigterm_step)
    printed_alone = alone.communicate(timeout=60)[0]
    assert dealt_line(1, 2, sigterm_step, "this host") in printed_alone, printed_alone[-3000:]
    drop_steps_after(os.path.join(out_dir, "ids-alone.log"), resumed_at)  # trained again below, by two hosts

    # 3. Both start again, from the one host's checkpoint, and finish.
    workers = start_workers(config_path, out_dir)
    printed = finish(workers)
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(p[-3000:] for p in printed)
    assert f"resumed from {os.path.join(run_dir, 'checkpoints', f'ckpt-{resumed_at}')}: step {resumed_at}" in printed[0], printed[0][-3000:]
    assert dealt_line(2, 1, resumed_at, "the 2 hosts in turns") in printed[0], printed[0][-3000:]
    assert "worker 1: resumed from" in printed[1]  # the same checkpoint, restored from the chief's directory

    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == resumed_at and metrics["steps"] == steps
    assert metrics["history"]["epoch"] == list(range(1, EPOCHS + 1)), metrics["history"]
    # 512 classes, an untrained model: the true loss is near ln(512) = 6.24; a sum over 2 workers is 12.5.
    assert all(loss < 1.2 * math.log(NUM) for loss in metrics["history"]["loss"]), metrics["history"]
    progress = [float(line.split(" loss ")[1].split()[0]) for line in printed[0].splitlines() if line.startswith("step ")]
    assert progress and all(loss < 1.2 * math.log(NUM) for loss in progress), progress
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "metrics.json"]  # no worker's temporary files left

    log = read_log(out_dir)
    assert sorted({step for step, _ in log}) == list(range(steps))
    assert {replica for _, replica in log} == {0, 1}
    # Every step's global batch, in replica order, whichever hosts trained it: each epoch is every id once.
    stream = [i for step in range(steps) for replica in range(2) for i in log[(step, replica)]]
    assert_exact_epochs([stream], NUM, NUM)
    assert len(glob.glob(os.path.join(out_dir, "ids-*.log"))) == 3

"""Two real JAX processes on loopback (`jax.distributed`, one host each, 4 CPU devices each) training
one model with one shared run_dir, as the hosts of a TPU slice do: one is killed mid-run and the other
stops with one line, both start again, one gets SIGTERM (both stop at one agreed step), one process alone resumes
(the rest of the epoch dealt to it) and is killed, both start again and finish. Every device's
slice of every global batch is checked against what the TF path's strategy hands the same replica:
host h's own input pipeline (`InputContext(2, h, 8)`) feeds its 4 devices, element by element.

Slow (two JAX processes per round): `pytest -m "not slow"` skips it locally; CI runs it.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from jax_child import requires_jax
from test_jax_train import _env
from test_multiworker import (agreed_sigterm_step, dealt_line, drop_steps_after, finish, free_ports,
                              kill_after_its_first_checkpoint, wait_for_step)
from test_preemption import CHILD, REPO, assert_exact_epochs, max_step, read_log, train_config

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow, requires_jax]

EPOCHS, STEPS_PER_EPOCH, NUM, HOSTS, DEVICES = 3, 8, 512, 2, 8


def start_processes(config_path: str, out_dir: str, mode: str = "train_jax") -> list[subprocess.Popen]:
    """The two processes of one jax.distributed job (a fresh coordinator port: a restarted job is a new one)."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    processes = []
    for index in range(HOSTS):
        env = _env(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(HOSTS), JAX_PROCESS_ID=str(index),
                   IDS_LOG=f"ids-{index}.log")
        env.pop("XLA_FLAGS")  # cluster.cpu_replicas: 4 per process
        processes.append(subprocess.Popen([sys.executable, CHILD, mode, config_path, out_dir], cwd=REPO,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return processes


def alone_and_killed(tmp_path, config: dict, mode: str, sigterm_step: int) -> tuple[int, str]:
    """One process alone (a slice that came back smaller) resumes `config` from the two processes' checkpoint at
    `sigterm_step`, a checkpoint each step, and is SIGKILLed after its first: (the step the next run resumes
    from, what it printed)."""
    alone_config = str(tmp_path / "alone.json")
    json.dump({**config, "train": {**config["train"], "checkpoint_every_steps": 1}}, open(alone_config, "w"))
    env = _env(IDS_LOG="ids-alone.log")
    env.pop("XLA_FLAGS")
    alone = subprocess.Popen([sys.executable, CHILD, mode, alone_config, str(tmp_path / "out")], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    resumed_at = kill_after_its_first_checkpoint(alone, config["train"]["run_dir"], sigterm_step)
    return resumed_at, alone.communicate(timeout=60)[0]


def two_then_one_then_two_on_jax(raw: dict, tmp_path, mode: str) -> tuple[str, list[str]]:
    """Issue 51's round of slices on JAX, one device a process: two processes get SIGTERM past step 5, one process of
    2 devices resumes and is SIGKILLed after its first checkpoint (`alone_and_killed`), two processes resume from that
    and finish: (what the one printed, what the two printed at the end)."""
    run_dir, out_dir = raw["train"]["run_dir"], str(tmp_path / "out")
    raw = {**raw, "model": {**raw["model"], "framework": "jax"}, "cluster": {"cpu_replicas": 1}}
    config_path = str(tmp_path / "config.json")
    json.dump(raw, open(config_path, "w"))
    processes = start_processes(config_path, out_dir, mode)
    wait_for_step(processes, out_dir, 5)
    processes[1].send_signal(signal.SIGTERM)
    printed = finish(processes)
    assert [p.returncode for p in processes] == [143, 143], "\n----\n".join(p[-3000:] for p in printed)
    sigterm_step = agreed_sigterm_step(printed, run_dir)
    resumed_at, said = alone_and_killed(tmp_path, {**raw, "cluster": {"cpu_replicas": 2}}, mode, sigterm_step)
    drop_steps_after(os.path.join(out_dir, "ids-alone.log"), resumed_at)
    processes = start_processes(config_path, out_dir, mode)
    printed = finish(processes)
    assert [p.returncode for p in processes] == [0, 0], "\n----\n".join(p[-3000:] for p in printed)
    return said, printed


def tf_path_batches(config: dict, steps: int) -> dict[tuple[int, int], list[int]]:
    """(step, replica) → label ids: replica h*4 + k takes host h's input pipeline's element step*4 + k."""
    from tpu_pipeline.config import config_from_dict
    from tpu_pipeline.pipeline import Pipeline

    import tensorflow as tf

    data = config_from_dict(config).data.model_copy(update={"repeat": "forever"})
    pipeline, local = Pipeline.from_config(data), DEVICES // HOSTS
    batches = {}
    for host in range(HOSTS):
        elements = pipeline.build(tf.distribute.InputContext(HOSTS, host, DEVICES)).take(steps * local)
        for index, (_, labels) in enumerate(elements):
            step, k = divmod(index, local)
            batches[(step, host * local + k)] = [int(i) for i in labels.numpy()]
    return batches


def test_two_jax_processes_killed_and_terminated_resume_exactly_each_host_feeding_its_devices(tmp_path):
    from tpu_pipeline.records.demo_shapes import ensure_demo_dataset

    data_dir = ensure_demo_dataset(str(tmp_path / "data"), num_train=NUM, num_eval=64, size=16, num_shards=8)
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    config = train_config(data_dir, run_dir)
    config["model"]["framework"] = "jax"
    config["cluster"] = {"cpu_replicas": DEVICES // HOSTS}
    config["train"].update(epochs=EPOCHS, checkpoint_every_steps=3)
    config_path = str(tmp_path / "config.json")
    json.dump(config, open(config_path, "w"))
    steps = EPOCHS * STEPS_PER_EPOCH
    rng = random.Random(5)

    # 1. A host dies (SIGKILL) at the end of epoch 1: the other saves, then evaluates, whose collectives wait
    # for the dead host (JAX's own end would be an abort after its 100 s heartbeat timeout, rc -6). It stops
    # by itself with one line that says to start every host again, exit 2 (train/peer_watch.py; a step whose
    # collective is connected already fails at once and says the same).
    processes = start_processes(config_path, out_dir)
    wait_for_step(processes, out_dir, STEPS_PER_EPOCH)
    processes[1].send_signal(signal.SIGKILL)
    printed = finish(processes, timeout=90)
    assert processes[0].returncode == 2, printed[0][-3000:]
    said = [line for line in printed[0].splitlines() if line.startswith("tpu-pipeline train: error:")]
    assert len(said) == 1 and "a peer worker stopped or cannot be reached" in said[0], printed[0][-3000:]
    assert "start every worker again" in said[0] and "Traceback" not in printed[0], printed[0][-3000:]
    assert not os.path.exists(os.path.join(run_dir, "metrics.json"))
    killed_at = max_step(out_dir)

    # 2. Both start again from the chief's newest checkpoint; only process 1 gets SIGTERM: both save one step, exit 143.
    processes = start_processes(config_path, out_dir)
    wait_for_step(processes, out_dir, killed_at + rng.randint(2, 4))
    processes[1].send_signal(signal.SIGTERM)
    printed = finish(processes)
    assert [p.returncode for p in processes] == [143, 143], "\n----\n".join(p[-3000:] for p in printed)
    assert "Keras 3 on JAX" in printed[0] and "8 replicas on 2 hosts" in printed[0], printed[0][-3000:]
    sigterm_step = agreed_sigterm_step(printed, run_dir)

    # 2b. One process alone (a slice that came back smaller: 1 host of 4 devices): the rest of the epoch the
    # two were in is dealt to it; SIGKILLed after its first checkpoint (one each step), inside that rest.
    resumed_at, printed_alone = alone_and_killed(tmp_path, config, "train_jax", sigterm_step)
    assert dealt_line(1, 2, sigterm_step, "this host", replicas=DEVICES // HOSTS) in printed_alone, printed_alone[-3000:]
    drop_steps_after(os.path.join(out_dir, "ids-alone.log"), resumed_at)  # trained again below, by two hosts

    # 3. Both start again, from the one host's checkpoint, and finish.
    processes = start_processes(config_path, out_dir)
    printed = finish(processes)
    assert [p.returncode for p in processes] == [0, 0], "\n----\n".join(p[-3000:] for p in printed)
    assert f"resumed from {os.path.join(run_dir, 'checkpoints', f'ckpt-{resumed_at}')}: step {resumed_at}" in printed[0]
    assert dealt_line(2, 1, resumed_at, "the 2 hosts in turns", replicas=DEVICES) in printed[0], printed[0][-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert metrics["resumed_from_step"] == resumed_at and metrics["steps"] == steps
    assert metrics["history"]["epoch"] == list(range(1, EPOCHS + 1)), metrics["history"]
    assert metrics["cluster"] == {"kind": "cpu", "replicas": DEVICES, "hosts": HOSTS}
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "metrics.json"]  # no process's temporary files left

    log = read_log(out_dir)
    assert sorted({step for step, _ in log}) == list(range(steps))
    # Every step of 2 hosts is what the TF path's strategy hands each replica, but those of the one host and the
    # rest of that epoch dealt back to two; every epoch, whichever hosts read it, is each id once.
    dealt = range(sigterm_step, (resumed_at // STEPS_PER_EPOCH + 1) * STEPS_PER_EPOCH)
    tf_path = tf_path_batches(config, steps)
    assert {key: ids for key, ids in log.items() if key[0] not in dealt} == {
        key: ids for key, ids in tf_path.items() if key[0] not in dealt}
    alone_steps = [[i for device in range(DEVICES // HOSTS) for i in log[(step, device)]] for step in range(sigterm_step, resumed_at)]
    assert all(len(ids) == 64 for ids in alone_steps), alone_steps  # one host's 4 devices, 16 examples each
    assert_exact_epochs([[i for step in range(steps) for device in range(DEVICES) for i in log.get((step, device), [])]],
                        NUM, NUM)


def test_two_jax_processes_train_a_packed_language_model_on_the_documents_of_an_uninterrupted_run(tmp_path):
    """Each host's packed stream stops at a place of its own: before each save both publish theirs through
    jax.distributed's store, and the chief's checkpoint holds both. Killed, SIGTERMed, finished: at every step
    each host's device trained on the documents of an uninterrupted run (input pipeline h of 2)."""
    from test_multiworker_sequences import EPOCHS as LM_EPOCHS, STEPS_PER_EPOCH as LM_STEPS, uninterrupted
    from test_text_lm import converted, lm_config

    data_dir = converted(tmp_path, count=200, splits="train")
    run_dir, out_dir = str(tmp_path / "run"), str(tmp_path / "out")
    os.makedirs(out_dir)
    raw = lm_config(data_dir, run_dir, length=128, epochs=LM_EPOCHS, steps=LM_STEPS, eval_data=False,
                    checkpoint_every_steps=2, max_checkpoints=2)
    raw["data"]["sequence"]["window"] = 16  # small windows: the two hosts' places differ soon
    raw["data"]["sequence"]["row_shuffle"] = 2
    raw["model"]["framework"] = "jax"
    raw["cluster"] = {"cpu_replicas": 1}  # one device per process: input pipeline h feeds device h
    config_path = str(tmp_path / "config.json")
    json.dump(raw, open(config_path, "w"))
    steps = LM_EPOCHS * LM_STEPS
    rng = random.Random(7)

    processes = start_processes(config_path, out_dir, "train_lm_jax")
    wait_for_step(processes, out_dir, rng.randint(4, 7))
    for process in processes:
        process.send_signal(signal.SIGKILL)
    finish(processes, timeout=60)
    killed_at = max_step(out_dir)

    processes = start_processes(config_path, out_dir, "train_lm_jax")
    wait_for_step(processes, out_dir, killed_at + rng.randint(2, 3))
    processes[1].send_signal(signal.SIGTERM)
    printed = finish(processes)
    assert [p.returncode for p in processes] == [143, 143], "\n----\n".join(p[-3000:] for p in printed)
    assert "input pipeline 0 of 2 from the window at example" in printed[0], printed[0][-3000:]
    assert "input pipeline 1 of 2 from the window at example" in printed[1], printed[1][-3000:]

    processes = start_processes(config_path, out_dir, "train_lm_jax")
    printed = finish(processes)
    assert [p.returncode for p in processes] == [0, 0], "\n----\n".join(p[-3000:] for p in printed)
    log = read_log(out_dir)  # also checks that a redone step saw the same documents
    assert log == uninterrupted(raw, steps)


def test_two_jax_processes_of_a_packed_language_model_go_on_on_one_then_on_two_again(tmp_path):
    """Issue 51 on JAX: two processes get SIGTERM, one process of 2 devices resumes (the rows the two had left of
    their epoch dealt to it) and is SIGKILLed inside them, two processes resume from that and finish; every document
    is trained on once an epoch (`assert_every_document_once_an_epoch`)."""
    from test_multiworker_sequences import SLICE_CHANGE_EPOCHS, assert_every_document_once_an_epoch, slice_change_run

    raw, run_dir, out_dir = slice_change_run(tmp_path)
    epochs, per_epoch = SLICE_CHANGE_EPOCHS
    said, printed = two_then_one_then_two_on_jax(raw, tmp_path, "train_lm_jax")
    assert ("this run has 1 host (2 replicas), the checkpoint 2 hosts: the rows 2 hosts had left of data epoch "
            in said), said[-3000:]
    assert "the checkpoint 1 host: the rows 1 host had left of data epoch" in printed[0], printed[0][-3000:]
    assert_every_document_once_an_epoch(out_dir, epochs * per_epoch, 200)


def test_two_jax_processes_of_a_mixture_go_on_on_one_then_on_two_again(tmp_path):
    """Issue 51 on JAX, a mixture of two image sources: two processes get SIGTERM, one process of 2 devices resumes
    (the rest of each source's epoch dealt to it) and is SIGKILLed inside it, two processes resume from that and
    finish; each source's images are trained on once an epoch (`assert_every_image_once_an_epoch`)."""
    from test_multiworker_mixture import assert_every_image_once_an_epoch, mixture_run

    raw, run_dir, out_dir = mixture_run(tmp_path)
    said, printed = two_then_one_then_two_on_jax(raw, tmp_path, "train_jax")
    assert ("this run has 1 host (2 replicas), the checkpoint 2 hosts: the rest of the sources' data epochs"
            in said and "is dealt to this host" in said), said[-3000:]
    assert "the checkpoint 1 host: the rest of the sources' data epochs" in printed[0], printed[0][-3000:]
    assert_every_image_once_an_epoch(out_dir)

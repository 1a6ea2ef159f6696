"""tests/fork_server.py: the suite's children forked from a server with TensorFlow imported behave as
processes started with subprocess.Popen (argv, environment, working directory, pipes, exit codes, signals),
and children it must not fork start fresh."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import fork_server

pytestmark = [pytest.mark.tf_builds, pytest.mark.slow]  # fork-safety is the TensorFlow build's (both run it)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "fork_echo_child.py")


def forked_popen(*args, **kwargs) -> subprocess.Popen:
    return fork_server.ForkServerPopen([sys.executable, CHILD, *args], **kwargs)


def test_a_forked_child_gets_its_argv_environment_directory_pipes_and_exit_code(tmp_path):
    env = {**os.environ, "FORK_ECHO": "given"}
    child = forked_popen("3", cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = child.communicate("a line in\n", timeout=120)
    seen = json.loads(out)
    assert child.returncode == 3 and err == "to stderr\n"
    assert fork_server.SERVERS.forked(child), "the echo child must have come from a server"
    assert seen["tensorflow_before"], "a forked child has TensorFlow imported before its first line"
    assert seen == {**seen, "argv": [CHILD, "3"], "cwd": str(tmp_path), "pid": child.pid, "path0": HERE,
                    "env": "given", "main": "__main__", "stdin": "a line in"}


def test_a_forked_child_is_killed_by_a_real_signal_and_waits_and_polls_as_popen(tmp_path):
    child = forked_popen("0", "sleep", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert json.loads(child.stdout.readline())["pid"] == child.pid
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL and child.poll() == -signal.SIGKILL
    terminated = forked_popen("0", "sleep", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    terminated.stdout.readline()
    terminated.terminate()
    assert terminated.wait(timeout=60) == -signal.SIGTERM


def test_consecutive_children_hash_as_fresh_interpreters_do_and_run_is_forked_too():
    """A killed run and its resume come from different servers: different hash seeds, as fresh processes."""
    if subprocess.Popen is not fork_server.ForkServerPopen:
        pytest.skip("TPU_PIPELINE_TEST_FORK_SERVER=0: children start fresh")
    seen = [json.loads(subprocess.run([sys.executable, CHILD, "0"], stdin=subprocess.DEVNULL, capture_output=True,
                                      text=True, timeout=120, check=True).stdout) for _ in range(2)]
    assert all(s["tensorflow_before"] for s in seen), "subprocess.run goes through the fork server in this suite"
    assert seen[0]["pid"] != seen[1]["pid"]
    if "PYTHONHASHSEED" not in os.environ:
        assert seen[0]["hash"] != seen[1]["hash"]


def test_a_child_whose_tensorflow_start_is_its_own_starts_fresh():
    """TF_CPP_MIN_LOG_LEVEL unset (our CLI sets it before importing TensorFlow) or libtpu allowed: a fresh
    interpreter, since TensorFlow reads both at import."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    for environment in (env, {**os.environ, "TPU_LOAD_LIBRARY": "1"}):
        child = forked_popen("0", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=environment)
        seen = json.loads(child.communicate(timeout=120)[0])
        assert child.returncode == 0 and not seen["tensorflow_before"] and not fork_server.SERVERS.forked(child)

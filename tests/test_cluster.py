"""Tests for tpu_pipeline.cluster: real CPU strategies, and the TPU path through a recording fake.

The TPU path cannot run here, so a fake `TpuBackend` records every call; the code under test
(where to look, in which order, once per process) is the same that runs on a TPU VM.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
import weakref

import pytest
import tensorflow as tf

from tpu_pipeline import tensorflow_install as install_lib
from tpu_pipeline.cluster import ClusterInfo, TfTpuBackend, choose_kind, detect_local_tpu, resolve
from tpu_pipeline.cluster import tpu as tpu_lib
from tpu_pipeline.cluster.resolver import check_tpu_stack
from tpu_pipeline.cluster.tpu_stack import TensorFlowStack
from tpu_pipeline.config.base import validate
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.errors import ClusterError, ConfigError

pytestmark = pytest.mark.tf_builds

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------
# A recording fake of the TPU seam.


class FakeResolver:
    """Stands in for TPUClusterResolver: a named TPU lists its workers, 'local' lists none."""

    task_type = "worker"

    def __init__(self, tpu: str, workers: int):
        self.tpu = tpu
        self.workers = workers

    def cluster_spec(self) -> tf.train.ClusterSpec:
        if self.tpu == "local":
            return tf.train.ClusterSpec({})
        return tf.train.ClusterSpec({"worker": [f"10.0.0.{i}:8470" for i in range(self.workers)]})


def stack(build="TPU", tensorflow=(("tensorflow-tpu", "2.19.1"),), libtpu="0.0.10", libtpu_off=None) -> TensorFlowStack:
    """A TensorFlow as the seam reports it; by default the TPU build with its own libtpu, loaded."""
    install = install_lib.TensorFlowInstall(tuple(tensorflow), "2.19.0", libtpu, "==0.0.10")
    return TensorFlowStack(build, tensorflow[-1][1], install, libtpu_off)


PLAIN_TF = stack("CPU", (("tensorflow", "2.21.0"),), libtpu=None)


class FakeTpuBackend:
    """Records (call, tpu, ...) tuples; TPUs outside `reachable` fail where `fail_at` says."""

    def __init__(self, reachable=(), *, evidence=None, workers=1, cores_per_host=8, fail_at="make_resolver",
                 tensorflow=None):
        self.reachable = set(reachable)
        self.evidence = evidence
        self.tensorflow = tensorflow or stack()
        self.workers = workers
        self.cores_per_host = cores_per_host
        self.fail_at = fail_at
        self.calls: list[tuple] = []

    def _maybe_fail(self, step: str, tpu: str) -> None:
        if tpu not in self.reachable and step == self.fail_at:
            raise ValueError(f"fake: no TPU named {tpu} ({step})")

    def local_tpu_evidence(self):
        self.calls.append(("evidence",))
        return self.evidence

    def tensorflow_stack(self):
        self.calls.append(("stack",))
        return self.tensorflow

    def make_resolver(self, tpu, zone, project):
        self.calls.append(("make_resolver", tpu, zone, project))
        self._maybe_fail("make_resolver", tpu)
        return FakeResolver(tpu, self.workers)

    def connect(self, resolver):
        self.calls.append(("connect", resolver.tpu))
        self._maybe_fail("connect", resolver.tpu)

    def initialize(self, resolver):
        self.calls.append(("initialize", resolver.tpu))
        self._maybe_fail("initialize", resolver.tpu)

    def make_strategy(self, resolver):
        self.calls.append(("make_strategy", resolver.tpu))
        cores = self.workers * self.cores_per_host
        devices = tuple(
            f"/job:worker/replica:0/task:{i // self.cores_per_host}/device:TPU:{i % self.cores_per_host}"
            for i in range(cores)
        )
        extended = types.SimpleNamespace(worker_devices=devices, num_hosts=self.workers)
        return types.SimpleNamespace(num_replicas_in_sync=cores, extended=extended)

    def tpu_steps(self) -> list[tuple]:
        """The calls after the probes of this machine (its TPU device files, its TensorFlow)."""
        return [c for c in self.calls if c[0] not in ("evidence", "stack")]


def connected(tpu: str, zone=None, project=None) -> list[tuple]:
    """The exact call sequence of one successful connection."""
    return [("make_resolver", tpu, zone, project), ("connect", tpu), ("initialize", tpu), ("make_strategy", tpu)]


# --------------------------------------------------------------------------------------------
# CPU


def test_default_is_cpu_default_strategy_with_one_replica():
    fake = FakeTpuBackend()
    info = resolve(env={}, tpu_backend=fake)
    assert isinstance(info, ClusterInfo)
    assert info.kind == "cpu"
    assert info.strategy is tf.distribute.get_strategy()
    assert info.num_replicas == 1 == info.strategy.num_replicas_in_sync
    assert info.num_hosts == 1
    assert info.devices == ("/device:CPU:0",)
    assert info.memory is None and info.tpu is None
    assert fake.calls == [("evidence",)]  # looked for a TPU VM, tried no TPU
    assert info.describe() == "cluster: cpu, 1 replica on 1 host (DefaultDistributionStrategy); devices: CPU:0"


def test_eight_cpu_replicas_mirror_over_logical_cpus(cpu_devices):
    info = resolve(ClusterConfig(cpu_replicas=8), env={}, tpu_backend=FakeTpuBackend())
    assert info.kind == "cpu"
    assert isinstance(info.strategy, tf.distribute.MirroredStrategy)
    assert info.strategy.num_replicas_in_sync == 8 == info.num_replicas
    assert [d.split("/device:")[1] for d in info.devices] == [f"CPU:{i}" for i in range(8)]
    # Each replica really runs: the sum over replicas of 1 is 8.
    per_replica = info.strategy.run(lambda: tf.constant(1.0))
    assert float(info.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) == 8.0
    assert info.describe() == (
        "cluster: cpu, 8 replicas on 1 host (MirroredStrategy, from cluster.cpu_replicas); "
        "devices: CPU:0 .. CPU:7 (8)"
    )


def test_cpu_replicas_other_than_existing_split_is_an_error(cpu_devices):
    with pytest.raises(ClusterError) as raised:
        resolve(ClusterConfig(cpu_replicas=4), env={}, tpu_backend=FakeTpuBackend())
    message = str(raised.value)
    assert "cluster.cpu_replicas=4" in message
    assert "already split into 8 logical devices" in message
    assert "cluster.cpu_replicas=8" in message  # the fix


def _run_fresh(code: str) -> str:
    """Runs `code` in a fresh Python (TensorFlow not initialized yet) and returns its stdout."""
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_fresh_process_cpu_split_then_error_after_tf_started():
    out = _run_fresh(
        """
        from tpu_pipeline.cluster import resolve, tpu
        from tpu_pipeline.config.cluster import ClusterConfig
        from tpu_pipeline.errors import ClusterError
        no_tpu = type("NoTpu", (tpu.TfTpuBackend,), {"local_tpu_evidence": lambda self: None})()
        info = resolve(ClusterConfig(cpu_replicas=3), env={}, tpu_backend=no_tpu)
        print("split", info.kind, info.num_replicas, info.strategy.num_replicas_in_sync)
        # Asked for a TPU on a machine without one: the places looked at are listed, 'local' is not tried.
        try:
            resolve(ClusterConfig(accelerator="tpu"), env={}, tpu_backend=no_tpu)
        except ClusterError as error:
            print("tpu-error", "TPU attached to this VM: no /dev/accel*" in str(error), "raised" in str(error))
        """
    )
    assert "split cpu 3 3" in out
    assert "tpu-error True False" in out

    out = _run_fresh(
        """
        import tensorflow as tf
        from tpu_pipeline.cluster import resolve
        from tpu_pipeline.config.cluster import ClusterConfig
        from tpu_pipeline.errors import ClusterError
        tf.constant(1.0) + 1.0  # TensorFlow starts with one CPU device
        try:
            resolve(ClusterConfig(accelerator="cpu", cpu_replicas=2), env={})
        except ClusterError as error:
            print("error:", str(error).replace("\\n", " "))
        """
    )
    assert "error: cluster.cpu_replicas=2 needs 2 logical CPU devices" in out
    assert "before any other TensorFlow op" in out


def test_the_first_demo_run_with_cpu_replicas_splits_the_cpu_before_the_demo_data_is_written(tmp_path):
    """On a fresh machine `tpu-pipeline train cluster.cpu_replicas=8` wrote the demo data (TensorFlow's JPEG
    encoder) before resolving, and failed: "needs 8 logical CPU devices, but TensorFlow was already initialized
    with 1". A second run, the data cached, worked. The CLI's config check and `demo_config` split first."""
    out = _run_fresh(
        f"""
        from tpu_pipeline.commands._common import _check_accelerator
        from tpu_pipeline.cluster import resolve
        from tpu_pipeline.config.cluster import ClusterConfig
        from tpu_pipeline.records import ensure_demo_dataset
        _check_accelerator({{"cluster": {{"cpu_replicas": 2}}}})  # what train and doctor run before the demo data
        ensure_demo_dataset({str(tmp_path / "cli")!r}, num_train=4, num_eval=2, size=16, num_shards=1)
        print("cli", resolve(ClusterConfig(cpu_replicas=2)).strategy.num_replicas_in_sync)
        """
    )
    assert "cli 2" in out
    out = _run_fresh(
        f"""
        from tpu_pipeline.cluster import resolve
        from tpu_pipeline.demo import demo_config
        config = demo_config(["cluster.cpu_replicas=2"], cache_dir={str(tmp_path / "api")!r}, num_train=4,
                             num_eval=2, size=16, num_shards=1)
        print("api", resolve(config.cluster).strategy.num_replicas_in_sync)
        """
    )
    assert "api 2" in out


# --------------------------------------------------------------------------------------------
# TPU, through the seam


def test_tpu_name_env_with_zone_and_project():
    fake = FakeTpuBackend(reachable={"my-tpu"})
    env = {"TPU_NAME": "my-tpu", "TPU_ZONE": "us-central2-b", "TPU_PROJECT": "proj"}
    info = resolve(env=env, tpu_backend=fake)
    assert fake.tpu_steps() == connected("my-tpu", "us-central2-b", "proj")
    assert (info.kind, info.num_replicas, info.num_hosts, info.tpu) == ("tpu", 8, 1, "my-tpu")
    assert info.source == "TPU_NAME env var"
    assert len(info.devices) == 8 and info.devices[-1].endswith("TPU:7")
    assert info.describe().startswith("cluster: tpu, 8 replicas on 1 host (SimpleNamespace, tpu='my-tpu', from TPU_NAME")


def test_explicit_tpu_wins_over_env_and_config_zone_over_env():
    fake = FakeTpuBackend(reachable={"cfg-tpu"}, evidence="TPU device file /dev/accel0")
    config = ClusterConfig(tpu="cfg-tpu", tpu_zone="europe-west4-a")
    env = {"TPU_NAME": "env-tpu", "TPU_ZONE": "us-central2-b", "TPU_PROJECT": "proj"}
    info = resolve(config, env=env, tpu_backend=fake)
    assert fake.calls == connected("cfg-tpu", "europe-west4-a", "proj")  # no probe, no other TPU
    assert info.source == "cluster.tpu"


def test_colab_tpu_addr_becomes_grpc_address_without_zone():
    fake = FakeTpuBackend(reachable={"grpc://10.0.0.2:8470"})
    info = resolve(env={"COLAB_TPU_ADDR": "10.0.0.2:8470", "TPU_ZONE": "us-central1-b"}, tpu_backend=fake)
    assert fake.tpu_steps() == connected("grpc://10.0.0.2:8470")
    assert info.tpu == "grpc://10.0.0.2:8470" and info.kind == "tpu"


def test_local_tpu_vm_only_with_evidence():
    fake = FakeTpuBackend(reachable={"local"}, evidence="TPU device file /dev/accel0", workers=1, cores_per_host=4)
    info = resolve(env={}, tpu_backend=fake)
    assert fake.tpu_steps() == connected("local")
    assert (info.kind, info.num_replicas, info.tpu) == ("tpu", 4, "local")
    assert "/dev/accel0" in info.source

    no_evidence = FakeTpuBackend(reachable={"local"})
    assert resolve(env={}, tpu_backend=no_evidence).kind == "cpu"
    assert no_evidence.tpu_steps() == []


def test_order_resolve_connect_initialize_strategy_and_second_resolve_reuses():
    fake = FakeTpuBackend(reachable={"my-tpu", "other-tpu"})
    first = resolve(env={"TPU_NAME": "my-tpu"}, tpu_backend=fake)
    second = resolve(env={"TPU_NAME": "my-tpu"}, tpu_backend=fake)
    assert [c[0] for c in fake.calls] == ["evidence", "make_resolver", "connect", "initialize", "make_strategy", "evidence"]
    assert second.strategy is first.strategy
    # Keyed per TPU address: another TPU gets its own connection, the first is still not re-initialized.
    resolve(ClusterConfig(tpu="other-tpu"), env={}, tpu_backend=fake)
    resolve(env={"TPU_NAME": "my-tpu"}, tpu_backend=fake)
    assert [c for c in fake.calls if c[0] == "initialize"] == [("initialize", "my-tpu"), ("initialize", "other-tpu")]


def test_failed_initialize_is_not_cached_and_is_retried():
    fake = FakeTpuBackend(reachable=(), fail_at="initialize")
    with pytest.raises(ClusterError):
        resolve(ClusterConfig(tpu="busy-tpu"), env={}, tpu_backend=fake)
    fake.reachable.add("busy-tpu")
    info = resolve(ClusterConfig(tpu="busy-tpu"), env={}, tpu_backend=fake)
    assert info.kind == "tpu"
    assert [c[0] for c in fake.calls].count("initialize") == 2
    assert [c[0] for c in fake.calls].count("make_strategy") == 1


def test_multi_host_pod_slice_num_hosts_from_cluster_spec():
    fake = FakeTpuBackend(reachable={"pod"}, workers=4, cores_per_host=8)
    info = resolve(env={"TPU_NAME": "pod"}, tpu_backend=fake)
    assert (info.num_hosts, info.num_replicas, len(info.devices)) == (4, 32, 32)
    assert "32 replicas on 4 hosts" in info.describe()


def test_tpu_vm_num_hosts_from_strategy_when_cluster_spec_empty():
    fake = FakeTpuBackend(reachable={"local"}, evidence="TPU device file /dev/vfio/0", workers=2)
    info = resolve(env={}, tpu_backend=fake)  # 'local' resolver: empty cluster spec
    assert info.num_hosts == 2


def test_an_unreachable_tpu_name_is_refused_never_replaced_by_the_cpu():
    """TPU_NAME is how Cloud's scripts name the TPU to use: one that does not answer is an error, as
    cluster.tpu's is, and cluster.accelerator=cpu is the way to train without it."""
    fake = FakeTpuBackend(reachable=())
    with pytest.raises(ClusterError) as raised:
        resolve(env={"TPU_NAME": "gone"}, tpu_backend=fake)
    lines = str(raised.value).splitlines()
    assert lines[0] == "no TPU found (the TPU_NAME env var names 'gone'). Tried:"
    assert lines[1].startswith("  - TPU_NAME env var: tpu='gone'")
    assert lines[-1] == "  - or train without a TPU: cluster.accelerator=cpu (or gpu), or unset TPU_NAME."
    assert fake.tpu_steps() == [("make_resolver", "gone", None, None)]
    assert resolve(ClusterConfig(accelerator="cpu"), env={"TPU_NAME": "gone"}, tpu_backend=fake).kind == "cpu"


def test_asked_for_tpu_none_found_lists_every_attempt_and_the_fix():
    fake = FakeTpuBackend(reachable=(), fail_at="connect")
    env = {"TPU_NAME": "gone", "TPU_ZONE": "us-central2-b", "COLAB_TPU_ADDR": "10.1.1.1:8470"}
    with pytest.raises(ClusterError) as raised:
        resolve(ClusterConfig(accelerator="tpu"), env=env, tpu_backend=fake)
    message = str(raised.value)
    lines = message.splitlines()
    assert lines[0] == "no TPU found (cluster.accelerator is 'tpu'). Tried:"
    assert lines[1] == (
        "  - TPU_NAME env var: tpu='gone' zone='us-central2-b' project=None: "
        "raised ValueError: fake: no TPU named gone (connect)"
    )
    assert lines[2] == (
        "  - COLAB_TPU_ADDR env var: tpu='grpc://10.1.1.1:8470': "
        "raised ValueError: fake: no TPU named grpc://10.1.1.1:8470 (connect)"
    )
    # No device file: libtpu was not loaded here, so 'local' is not tried, only noted.
    assert lines[3] == "  - TPU attached to this VM: no /dev/accel* or /dev/vfio/N device file, not Colab's TPU runtime"
    for fix in ("set TPU_NAME", "cluster.tpu=", "Colab", install_lib.TPU_SETUP_COMMAND, install_lib.TPU_PIP_COMMAND):
        assert fix in message
    assert not [c for c in fake.calls if c[0] == "initialize"]


def test_explicit_tpu_that_fails_is_an_error_even_in_auto():
    fake = FakeTpuBackend(reachable=())
    with pytest.raises(ClusterError, match=r"cluster.tpu is set.*\n  - cluster.tpu: tpu='x'"):
        resolve(ClusterConfig(tpu="x"), env={}, tpu_backend=fake)


def test_real_backend_makes_the_current_tf_calls(monkeypatch):
    """The default seam calls TPUClusterResolver -> connect -> initialize_tpu_system -> TPUStrategy."""
    calls = []

    class Resolver:
        task_type = "worker"

        def __init__(self, tpu, zone, project):
            calls.append(("TPUClusterResolver", tpu, zone, project))

        def cluster_spec(self):
            return tf.train.ClusterSpec({})

    strategy = types.SimpleNamespace(
        num_replicas_in_sync=8, extended=types.SimpleNamespace(worker_devices=("TPU:0",) * 8, num_hosts=1)
    )
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", Resolver)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect",)))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("initialize",)))
    monkeypatch.setattr(tf.distribute, "TPUStrategy", lambda r: calls.append(("TPUStrategy",)) or strategy)
    monkeypatch.setattr(tpu_lib, "_CONNECTIONS", weakref.WeakKeyDictionary())  # keep the process cache clean

    # A remote address: 'local' here would stop at the dead-end check (no TPU device on this machine).
    address = "grpc://10.0.0.2:8470"
    info = resolve(ClusterConfig(tpu=address), env={}, tpu_backend=TfTpuBackend())
    resolve(ClusterConfig(tpu=address), env={})  # the default backend: another instance, same process cache
    assert calls == [("TPUClusterResolver", address, None, None), ("connect",), ("initialize",), ("TPUStrategy",)]
    assert info.strategy is strategy and info.num_replicas == 8


# --------------------------------------------------------------------------------------------
# A TPU of this machine that this TensorFlow cannot drive: one line, before any TPU call


DEVICE = "TPU device file /dev/accel0"
SETUP_FIX = f"Fix: {install_lib.TPU_SETUP_COMMAND} (in this repository), or: {install_lib.TPU_PIP_COMMAND}"


def dead_end(config=None, env=None, **fake) -> tuple[str, FakeTpuBackend]:
    """The ClusterError's message, checked to be one line, and the fake (to see that no TPU call was made)."""
    backend = FakeTpuBackend(**fake)
    with pytest.raises(ClusterError) as raised:
        resolve(config or ClusterConfig(), env=env or {}, tpu_backend=backend)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    assert "local" not in {c[1] for c in backend.tpu_steps()}  # this machine's TPU was never touched
    return message, backend


@pytest.mark.parametrize("config, env, named", [
    (ClusterConfig(), {}, "a TPU is attached to this machine (TPU device file /dev/accel0)"),
    (ClusterConfig(), {"TPU_NAME": "local"}, "TPU_NAME=local asks for the TPU of this machine"),
    (ClusterConfig(accelerator="tpu"), {}, "a TPU is attached to this machine (TPU device file /dev/accel0)"),
    (ClusterConfig(tpu="local"), {}, "cluster.tpu=local asks for the TPU of this machine"),
])
def test_plain_tensorflow_with_a_tpu_attached_names_the_build_and_the_fix(config, env, named):
    """(a) the registry's TensorFlow has no TPU kernels: auto mode must not train on the CPU beside a billed TPU."""
    message, backend = dead_end(config, env, reachable={"local"}, evidence=DEVICE, tensorflow=PLAIN_TF)
    assert message == (
        f"{named}, but TensorFlow 2.21.0 here is a CPU build, which has no TPU kernels (the TPU build is the "
        "tensorflow-tpu distribution); installed: tensorflow 2.21.0, tf-keras 2.19.0, libtpu not installed as a "
        f"package. {SETUP_FIX}"
    )
    assert backend.tpu_steps() == []


def test_libtpu_held_back_for_a_mismatch_names_it():
    """(b) prepare_tensorflow_import kept a libtpu that would abort `import tensorflow` out."""
    why = "tensorflow-tpu 2.20.0 aborts `import tensorflow` with libtpu 0.0.52 (measured: 0.0.40 and newer)"
    held = stack(tensorflow=(("tensorflow-tpu", "2.20.0"),), libtpu="0.0.52", libtpu_off=(why, install_lib.TPU_FIX))
    message, _ = dead_end(evidence="TPU device file /dev/vfio/0", tensorflow=held)
    assert message.startswith("a TPU is attached to this machine (TPU device file /dev/vfio/0), but TensorFlow did not "
                              f"load libtpu: {why}; installed: tensorflow-tpu 2.20.0, tf-keras 2.19.0, libtpu 0.0.52.")
    assert message.endswith(SETUP_FIX)


def test_users_own_tpu_load_library_zero_is_named_with_its_fix():
    off = stack(libtpu_off=("TPU_LOAD_LIBRARY=0 is set in the environment", "unset TPU_LOAD_LIBRARY"))
    message, _ = dead_end(env={"TPU_NAME": "local"}, evidence=DEVICE, tensorflow=off)
    assert message.endswith("TensorFlow did not load libtpu: TPU_LOAD_LIBRARY=0 is set in the environment; installed: "
                            "tensorflow-tpu 2.19.1, tf-keras 2.19.0, libtpu 0.0.10. Fix: unset TPU_LOAD_LIBRARY")


@pytest.mark.parametrize("config, env, fix", [
    (ClusterConfig(), {"TPU_NAME": "local"}, "Fix: unset TPU_NAME (or set it to your Cloud TPU's name, with TPU_ZONE "
                                             "and TPU_PROJECT), or train on this CPU with cluster.accelerator=cpu"),
    (ClusterConfig(accelerator="tpu"), {"TPU_NAME": " local "}, "Fix: unset TPU_NAME"),
    (ClusterConfig(tpu="local"), {}, "Fix: drop cluster.tpu=local to train on this machine's CPU or GPUs, or name "
                                     "your Cloud TPU: cluster.tpu=<name>"),
])
def test_local_named_on_a_machine_without_a_tpu(config, env, fix):
    """(c) whatever TensorFlow is installed: there is no TPU here to drive."""
    message, _ = dead_end(config, env, reachable={"local"})
    assert "asks for the TPU of this machine, but this machine has no TPU (no /dev/accel* or /dev/vfio/N device " \
           "file); installed: tensorflow-tpu 2.19.1" in message
    assert fix in message


def test_two_tensorflow_distributions_in_one_folder():
    """(d) tensorflow-tpu + tf-keras without --no-deps puts the registry's tensorflow beside it."""
    both = stack(tensorflow=(("tensorflow", "2.19.1"), ("tensorflow-tpu", "2.19.1")))
    message, _ = dead_end(evidence=DEVICE, tensorflow=both)
    assert ("but tensorflow 2.19.1 and tensorflow-tpu 2.19.1 are installed together: two TensorFlow distributions "
            "write one tensorflow/ folder") in message
    assert "installed: tensorflow 2.19.1 + tensorflow-tpu 2.19.1, tf-keras 2.19.0, libtpu 0.0.10" in message
    assert message.endswith(SETUP_FIX)


TWO_DISTRIBUTIONS = stack(tensorflow=(("tensorflow", "2.19.1"), ("tensorflow-tpu", "2.19.1")))


@pytest.mark.parametrize("tensorflow, why", [
    (TWO_DISTRIBUTIONS, "but tensorflow 2.19.1 and tensorflow-tpu 2.19.1 are installed together"),
    (PLAIN_TF, "but TensorFlow 2.21.0 here is a CPU build, which has no TPU kernels"),
], ids=["two distributions", "plain TensorFlow"])
def test_check_before_doctor_and_devices_refuses_in_one_line(tensorflow: TensorFlowStack, why: str) -> None:
    """check_tpu_stack, what `doctor` and `devices` run before measuring or resolving (in process here; the CLI's
    child-process test covers only a machine with no TPU): a TPU attached that this TensorFlow cannot drive is the
    resolver's one line, not a warning before a CPU run beside the billed TPU."""
    backend = FakeTpuBackend(reachable={"local"}, evidence=DEVICE, tensorflow=tensorflow)
    with pytest.raises(ClusterError) as raised:
        check_tpu_stack(ClusterConfig(), env={}, tpu_backend=backend)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"a TPU is attached to this machine ({DEVICE}), {why}")
    assert message.endswith(SETUP_FIX) and backend.tpu_steps() == []
    check_tpu_stack(ClusterConfig(accelerator="cpu"), env={}, tpu_backend=backend)  # the opt-out
    check_tpu_stack(ClusterConfig(), env={}, tpu_backend=FakeTpuBackend(evidence=DEVICE))  # the TPU build: may go on


def test_colab_tpu_runtime_counts_as_attached():
    colab = {"COLAB_TPU_1VM": "1", "TPU_ACCELERATOR_TYPE": "v5e-1"}
    message, _ = dead_end(env=colab, tensorflow=PLAIN_TF)
    assert message.startswith("a TPU is attached to this machine (Colab's TPU runtime (COLAB_TPU_1VM=1, "
                              "TPU_ACCELERATOR_TYPE=v5e-1)), but TensorFlow 2.21.0 here is a CPU build")
    fake = FakeTpuBackend(reachable={"local"})
    assert resolve(env=colab, tpu_backend=fake).tpu == "local"  # with the TPU build: tried, and connected
    # Colab's other runtimes set COLAB_TPU_1VM empty.
    assert resolve(env={"COLAB_TPU_1VM": ""}, tpu_backend=FakeTpuBackend(tensorflow=PLAIN_TF)).kind == "cpu"


def test_cpu_accelerator_is_the_opt_out_with_a_tpu_attached():
    fake = FakeTpuBackend(reachable={"local"}, evidence=DEVICE, tensorflow=PLAIN_TF)
    info = resolve(ClusterConfig(accelerator="cpu"), env={"TPU_NAME": "local"}, tpu_backend=fake)
    assert info.kind == "cpu" and fake.calls == []


def test_remote_tpus_need_no_tpu_kernels_here():
    for env, address in (({"TPU_NAME": "my-tpu"}, "my-tpu"), ({"COLAB_TPU_ADDR": "10.0.0.2:8470"}, "grpc://10.0.0.2:8470")):
        fake = FakeTpuBackend(reachable={address}, tensorflow=PLAIN_TF)
        assert resolve(env=env, tpu_backend=fake).tpu == address
        assert ("stack",) not in fake.calls
    fake = FakeTpuBackend(reachable={"grpc://10.0.0.2:8470"}, tensorflow=PLAIN_TF)
    assert resolve(ClusterConfig(tpu="grpc://10.0.0.2:8470"), env={}, tpu_backend=fake).kind == "tpu"
    # A remote TPU named beside an attached one is still tried first; the dead end comes after it.
    message, backend = dead_end(env={"TPU_NAME": "gone"}, evidence=DEVICE, tensorflow=PLAIN_TF)
    assert backend.tpu_steps() == [("make_resolver", "gone", None, None)]
    assert "CPU build" in message


def test_attached_tpu_that_fails_to_connect_is_an_error_not_a_cpu_fallback():
    fake = FakeTpuBackend(reachable=(), evidence=DEVICE, fail_at="initialize")
    with pytest.raises(ClusterError) as raised:
        resolve(env={}, tpu_backend=fake)
    lines = str(raised.value).splitlines()
    assert lines[0] == "no TPU found (a TPU is attached to this machine (TPU device file /dev/accel0)). Tried:"
    assert "raised ValueError: fake: no TPU named local (initialize)" in lines[1]
    assert lines[-1] == "  - or train on this machine's CPU or GPUs with cluster.accelerator=cpu (or gpu)."


def test_real_backend_reports_this_process_stack_through_the_same_check():
    """TfTpuBackend's stack is the imported TensorFlow's; with a TPU faked as attached, no TensorFlow in a CPU
    test process can drive it (.venv: no TPU kernels; .venv-tpu: libtpu not loaded, there is no device)."""
    import tensorflow as real_tf

    reported = TfTpuBackend().tensorflow_stack()
    assert reported.build == install_lib.tensorflow_build(real_tf) and reported.version == real_tf.__version__
    assert reported.install == install_lib.installed()
    assert (reported.build == "TPU") == reported.install.is_tpu_distribution

    attached = type("Attached", (TfTpuBackend,), {"local_tpu_evidence": lambda self: DEVICE})()
    with pytest.raises(ClusterError) as raised:
        resolve(env={}, tpu_backend=attached)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"a TPU is attached to this machine ({DEVICE}), but ")
    assert f"installed: {install_lib.installed().describe()}" in message and "Fix: " in message


@pytest.mark.parametrize("command", ["devices", "doctor", "train"])
def test_tpu_name_local_on_this_cpu_is_one_line_and_the_fix(command, tmp_path):
    """The user's view: `TPU_NAME=local tpu-pipeline devices|doctor|train` here, in whichever venv runs the suite:
    one line before anything runs (train and doctor write no demo data and measure nothing first)."""
    env = dict(os.environ, TPU_NAME="local", PYTHONPATH=REPO, TPU_PIPELINE_CACHE=str(tmp_path / "cache"))
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # a user's shell: the CLI silences TensorFlow's start-up lines itself
    result = subprocess.run([sys.executable, "-m", "tpu_pipeline.cli", command, f"train.run_dir={tmp_path / 'run'}"],
                            capture_output=True, text=True, env=env, timeout=120, cwd=REPO)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tpu-pipeline {command}: error: TPU_NAME=local asks for the TPU of this machine, but "
                               "this machine has no TPU")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()
    assert "Fix: unset TPU_NAME" in lines[0]


def test_detect_local_tpu_from_device_files_only(tmp_path):
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").touch()  # the VFIO control node exists on many non-TPU hosts
    assert detect_local_tpu(str(tmp_path)) is None  # whether or not libtpu is installed: .venv-tpu has it anywhere
    (tmp_path / "vfio" / "0").touch()
    assert detect_local_tpu(str(tmp_path)) == f"TPU device file {tmp_path}/vfio/0"
    (tmp_path / "accel0").touch()
    assert detect_local_tpu(str(tmp_path)) == f"TPU device file {tmp_path}/accel0"


# --------------------------------------------------------------------------------------------
# Multi-worker, GPU: the decision apart from construction


def tf_config(workers: int, chief: int = 0) -> dict[str, str]:
    cluster = {"worker": [f"host{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["chief:2222"]
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}


@pytest.mark.parametrize(
    "accelerator, env, num_gpus, expected",
    [
        ("auto", tf_config(2), 0, "multi-worker"),
        ("auto", tf_config(1, chief=1), 4, "multi-worker"),
        ("auto", tf_config(1), 0, "cpu"),
        ("auto", tf_config(1), 2, "gpu"),
        ("auto", {}, 0, "cpu"),
        ("auto", {}, 1, "gpu"),
        ("cpu", tf_config(2), 2, "cpu"),
        ("gpu", tf_config(2), 2, "gpu"),
        ("multi_worker", tf_config(1), 0, "multi-worker"),
    ],
)
def test_choose_kind(accelerator, env, num_gpus, expected):
    assert choose_kind(ClusterConfig(accelerator=accelerator), env, num_gpus=num_gpus) == expected


@pytest.mark.parametrize(
    "accelerator, env, num_gpus, needle",
    [
        ("gpu", {}, 0, "cluster.accelerator is 'gpu' but TensorFlow sees no GPU"),
        ("multi_worker", {}, 0, "TF_CONFIG env var is not set"),
        ("auto", {"TF_CONFIG": "{not json"}, 0, "TF_CONFIG env var is not valid JSON"),
        ("auto", {"TF_CONFIG": '{"cluster": {"worker": "h:1"}}'}, 0, "TF_CONFIG env var must be a JSON object"),
        ("auto", {"TF_CONFIG": '{"cluster": {"worker": ["a:1"], "ps": ["b:1"]}}'}, 0, "'ps' job"),
    ],
)
def test_choose_kind_errors_name_the_setting(accelerator, env, num_gpus, needle):
    with pytest.raises(ClusterError, match=needle.replace("*", r"\*")):
        choose_kind(ClusterConfig(accelerator=accelerator), env, num_gpus=num_gpus)


def test_cpu_replicas_under_tf_config_is_refused_not_ignored():
    # (with accelerator: multi_worker the config itself refuses cpu_replicas)
    with pytest.raises(ClusterError, match=r"cluster.cpu_replicas=8 splits one CPU host .* TF_CONFIG names 2 workers"):
        choose_kind(ClusterConfig(cpu_replicas=8), tf_config(2), num_gpus=0)


def test_two_worker_tf_config_builds_multi_worker_and_explains_late_start(cpu_devices):
    # TensorFlow is already running here (the fixture listed devices), so the collective cannot
    # start and the strategy fails at once instead of waiting for the other worker.
    with pytest.raises(ClusterError) as raised:
        resolve(env=tf_config(2), tpu_backend=FakeTpuBackend())
    message = str(raised.value)
    assert "multi-worker cluster from TF_CONFIG" in message
    assert "Collective ops must be configured at program startup" in message
    assert "call tpu_pipeline.cluster.resolve() at program start" in message


def test_multi_worker_refuses_gpus_key():
    with pytest.raises(ClusterError, match="cluster.gpus is not supported with a multi-worker"):
        resolve(ClusterConfig(gpus=[0]), env=tf_config(2), tpu_backend=FakeTpuBackend())


def test_gpus_key_checked_against_visible_gpus():
    assert choose_kind(ClusterConfig(gpus=[1]), {}, num_gpus=0) == "gpu"
    with pytest.raises(ClusterError, match=r"cluster.gpus=\[1\] names GPU 1 but only 0 are visible"):
        resolve(ClusterConfig(gpus=[1]), env={}, tpu_backend=FakeTpuBackend())


def test_gpu_requested_without_gpu():
    with pytest.raises(ClusterError, match="CUDA_VISIBLE_DEVICES='3'"):
        resolve(ClusterConfig(accelerator="gpu"), env={"CUDA_VISIBLE_DEVICES": "3"}, tpu_backend=FakeTpuBackend())


# --------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"cpu_replicas": 0}, "cluster.cpu_replicas=0: must be an integer of at least 1"),
        ({"accelerator": "tpuu"}, "cluster.accelerator='tpuu': must be 'auto', 'tpu', 'gpu', 'cpu' or 'multi_worker'"),
        ({"tpus": "my-tpu"}, "cluster.tpus: unknown key; allowed keys here: accelerator, coordinator_address, cpu_replicas, gpus, num_processes, process_id, tpu,"),
        ({"tpu": "  "}, "cluster.tpu: must not be empty"),
        ({"accelerator": "cpu", "tpu": "my-tpu"}, "cluster.tpu: a TPU is named but accelerator is 'cpu'"),
        ({"accelerator": "gpu", "cpu_replicas": 4}, "cluster.cpu_replicas: only applies to the CPU"),
        ({"accelerator": "cpu", "gpus": [0]}, "cluster.gpus: only applies to GPUs"),
        ({"gpus": [0, 0]}, "cluster.gpus: GPU indices must not repeat"),
        ({"gpus": [-1]}, "cluster.gpus: GPU indices must be >= 0"),
        ({"gpus": []}, "cluster.gpus: List should have at least 1 item"),
    ],
)
def test_config_errors_name_the_key(data, needle):
    with pytest.raises(ConfigError) as raised:
        validate(ClusterConfig, data, prefix="cluster")
    assert needle in str(raised.value)


def test_config_defaults_and_good_values():
    assert ClusterConfig().model_dump() == {
        "accelerator": "auto", "tpu": None, "tpu_zone": None, "tpu_project": None, "cpu_replicas": 1, "gpus": None,
        "coordinator_address": None, "num_processes": None, "process_id": None,
    }
    config = validate(ClusterConfig, {"accelerator": "tpu", "tpu": " grpc://10.0.0.2:8470 ", "tpu_zone": "us-central2-b"})
    assert (config.tpu, config.tpu_zone) == ("grpc://10.0.0.2:8470", "us-central2-b")


def test_resolving_twice_reuses_one_mirrored_strategy(eight_replica_strategy):
    """A second MirroredStrategy over the same devices would collide with the first's collectives."""
    first = resolve(ClusterConfig(cpu_replicas=8))
    second = resolve(ClusterConfig(cpu_replicas=8))
    assert first.strategy is second.strategy is eight_replica_strategy


def test_train_with_an_unreachable_tpu_name_stops_in_one_line_naming_it(demo_cache, tmp_path, capsys, monkeypatch):
    """Through the CLI, as a new user met it: `TPU_NAME=my-tpu tpu-pipeline train` used to warn and train on
    the CPU (exit 0). The name is looked up for real and fails (no Cloud TPU API here)."""
    from cli_children import in_process

    monkeypatch.setenv("TPU_NAME", "my-tpu")
    code, stdout, stderr = in_process(capsys, monkeypatch, demo_cache, "train", f"train.run_dir={tmp_path / 'run'}")
    assert code == 2, stdout[-2000:] + stderr[-2000:]
    assert "no TPU found (the TPU_NAME env var names 'my-tpu')" in stderr, stderr[-3000:]
    assert "cluster.accelerator=cpu" in stderr and "Traceback" not in stderr
    assert "step " not in stdout and not (tmp_path / "run" / "metrics.json").exists()

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

from tpu_pipeline.cluster import ClusterInfo, TfTpuBackend, choose_kind, detect_local_tpu, resolve
from tpu_pipeline.cluster import tpu as tpu_lib
from tpu_pipeline.config.base import validate
from tpu_pipeline.config.cluster import ClusterConfig
from tpu_pipeline.errors import ClusterError, ConfigError

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


class FakeTpuBackend:
    """Records (call, tpu, ...) tuples; TPUs outside `reachable` fail where `fail_at` says."""

    def __init__(self, reachable=(), *, evidence=None, workers=1, cores_per_host=8, fail_at="make_resolver"):
        self.reachable = set(reachable)
        self.evidence = evidence
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
        """The calls after the evidence probe."""
        return [c for c in self.calls if c[0] != "evidence"]


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
        # A real TPU attempt on a machine without one: TF's own error is listed, not raised bare.
        if tpu.detect_local_tpu() is None:
            try:
                resolve(ClusterConfig(accelerator="tpu"), env={}, tpu_backend=no_tpu)
            except ClusterError as error:
                print("tpu-error", "tpu='local': raised" in str(error))
        """
    )
    assert "split cpu 3 3" in out
    if detect_local_tpu() is None:
        assert "tpu-error True" in out

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
    fake = FakeTpuBackend(reachable={"local"}, evidence="libtpu", workers=2)
    info = resolve(env={}, tpu_backend=fake)  # 'local' resolver: empty cluster spec
    assert info.num_hosts == 2


def test_auto_falls_back_to_cpu_when_env_tpu_fails():
    fake = FakeTpuBackend(reachable=())
    info = resolve(env={"TPU_NAME": "gone"}, tpu_backend=fake)
    assert info.kind == "cpu"
    assert fake.tpu_steps() == [("make_resolver", "gone", None, None)]


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
    assert lines[3].startswith("  - TPU attached to this VM (no /dev/accel*") and lines[3].endswith(
        "tpu='local': raised ValueError: fake: no TPU named local (connect)"
    )
    for fix in ("set TPU_NAME", "cluster.tpu=", "Colab", "tensorflow-tpu"):
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

    info = resolve(ClusterConfig(tpu="local"), env={}, tpu_backend=TfTpuBackend())
    resolve(ClusterConfig(tpu="local"), env={})  # the default backend: another instance, same process cache
    assert calls == [("TPUClusterResolver", "local", None, None), ("connect",), ("initialize",), ("TPUStrategy",)]
    assert info.strategy is strategy and info.num_replicas == 8


def test_detect_local_tpu_from_device_files(tmp_path):
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").touch()  # the VFIO control node exists on many non-TPU hosts
    libtpu = tpu_lib.importlib.util.find_spec("libtpu") is not None
    assert (detect_local_tpu(str(tmp_path)) is None) is not libtpu
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
        ({"tpus": "my-tpu"}, "cluster.tpus: unknown key; allowed keys here: accelerator, cpu_replicas, gpus, tpu,"),
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
    }
    config = validate(ClusterConfig, {"accelerator": "tpu", "tpu": " grpc://10.0.0.2:8470 ", "tpu_zone": "us-central2-b"})
    assert (config.tpu, config.tpu_zone) == ("grpc://10.0.0.2:8470", "us-central2-b")


def test_resolving_twice_reuses_one_mirrored_strategy(eight_replica_strategy):
    """A second MirroredStrategy over the same devices would collide with the first's collectives."""
    first = resolve(ClusterConfig(cpu_replicas=8))
    second = resolve(ClusterConfig(cpu_replicas=8))
    assert first.strategy is second.strategy is eight_replica_strategy

"""Finding, connecting and initializing a TPU, behind one narrow seam.

Everything that touches a real TPU goes through a `TpuBackend` (six small calls). `TfTpuBackend`
makes the real TensorFlow calls; tests inject a recording fake, so the code path that decides
where to look, in which order, and that initializes a TPU only once per process is the same code
that runs on a TPU VM or in Colab.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from typing import Any, Mapping, Protocol

import tensorflow as tf

from tpu_pipeline import tensorflow_install as install_lib
from tpu_pipeline.cluster.tpu_stack import LOCAL, NO_DEVICE, TensorFlowStack, current_stack
from tpu_pipeline.config.cluster import ClusterConfig

log = logging.getLogger(__name__)


class TpuBackend(Protocol):
    """The only calls the TPU path makes outside Python. Order: resolver, connect, initialize, strategy."""

    def local_tpu_evidence(self) -> str | None:
        """Why we believe a TPU is attached to this machine (a TPU VM), or None."""

    def tensorflow_stack(self) -> TensorFlowStack:
        """The imported TensorFlow's build and the installed TensorFlow, tf-keras and libtpu."""

    def make_resolver(self, tpu: str, zone: str | None, project: str | None) -> Any:
        """A TPUClusterResolver for a TPU name, grpc:// address or 'local'."""

    def connect(self, resolver: Any) -> None:
        """Makes the TPU workers' devices visible to this process."""

    def initialize(self, resolver: Any) -> None:
        """Initializes the TPU system (wipes TPU memory: once per process per TPU)."""

    def make_strategy(self, resolver: Any) -> tf.distribute.Strategy:
        """The distribution strategy over the initialized TPU."""


def detect_local_tpu(dev: str = "/dev") -> str | None:
    """Evidence of a TPU VM: a TPU device file. None when there is none.

    `TPUClusterResolver("local")` succeeds on any machine, so auto mode tries it only with evidence.
    An installed libtpu is none: the TPU environment installs it on every machine.
    """
    device = install_lib.attached_tpu_device(dev)
    return f"TPU device file {device}" if device else None


class TfTpuBackend:
    """The real TensorFlow calls (TF 2.16+ APIs only)."""

    def local_tpu_evidence(self) -> str | None:
        return detect_local_tpu()

    def tensorflow_stack(self) -> TensorFlowStack:
        return current_stack()

    def make_resolver(self, tpu: str, zone: str | None, project: str | None) -> Any:
        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu, zone=zone, project=project)

    def connect(self, resolver: Any) -> None:
        tf.config.experimental_connect_to_cluster(resolver)

    def initialize(self, resolver: Any) -> None:
        tf.tpu.experimental.initialize_tpu_system(resolver)

    def make_strategy(self, resolver: Any) -> tf.distribute.Strategy:
        return tf.distribute.TPUStrategy(resolver)


DEFAULT_BACKEND = TfTpuBackend()


@dataclasses.dataclass(frozen=True)
class TpuCandidate:
    """One place a TPU may be: the address to try and where that address came from."""

    tpu: str
    zone: str | None
    project: str | None
    source: str


@dataclasses.dataclass(frozen=True)
class TpuConnection:
    """A connected, initialized TPU and its strategy (cached: reused by later resolve calls)."""

    candidate: TpuCandidate
    resolver: Any
    strategy: tf.distribute.Strategy


def tpu_candidates(
    config: ClusterConfig, env: Mapping[str, str], local_evidence: str | None
) -> tuple[list[TpuCandidate], list[str]]:
    """Where to look for a TPU, in order, and notes on the places checked and found empty.

    An explicit `cluster.tpu` is the only candidate: a named TPU that fails must not be replaced
    by another one. Otherwise: TPU_NAME, COLAB_TPU_ADDR (legacy Colab), then the TPU attached to
    this VM when there is evidence of one (a device file, Colab's TPU runtime). Without one, libtpu
    was not loaded (tensorflow_install), so 'local' is not tried.
    """
    zone = config.tpu_zone or env.get("TPU_ZONE") or None
    project = config.tpu_project or env.get("TPU_PROJECT") or None
    if config.tpu:
        return [_candidate(config.tpu, zone, project, "cluster.tpu")], []

    candidates, notes = [], []
    name = env.get("TPU_NAME", "").strip()
    if name:
        candidates.append(_candidate(name, zone, project, "TPU_NAME env var"))
    else:
        notes.append("TPU_NAME env var: not set")
    colab = env.get("COLAB_TPU_ADDR", "").strip()
    if colab:
        address = colab if colab.startswith("grpc://") else "grpc://" + colab
        candidates.append(_candidate(address, None, None, "COLAB_TPU_ADDR env var"))
    else:
        notes.append("COLAB_TPU_ADDR env var (legacy Colab TPU): not set")
    if local_evidence:
        candidates.append(_candidate(LOCAL, None, None, f"TPU attached to this VM ({local_evidence})"))
    else:
        notes.append(f"TPU attached to this VM: {NO_DEVICE}, not Colab's TPU runtime")
    return _unique(candidates), notes


def _candidate(tpu: str, zone: str | None, project: str | None, source: str) -> TpuCandidate:
    """Zone and project only matter for a TPU looked up by name through the Cloud TPU API."""
    by_name = tpu != LOCAL and not tpu.startswith("grpc://")
    return TpuCandidate(tpu, zone if by_name else None, project if by_name else None, source)


def _unique(candidates: list[TpuCandidate]) -> list[TpuCandidate]:
    """TPU_NAME=local on a TPU VM must not be tried twice."""
    unique: dict[str, TpuCandidate] = {}
    for candidate in candidates:
        unique.setdefault(candidate.tpu, candidate)
    return list(unique.values())


# backend -> {tpu address -> connection}. Weak keys: a test's fake backend takes its cache with it.
_CONNECTIONS: "weakref.WeakKeyDictionary[Any, dict[str, TpuConnection]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def connect_tpu(candidate: TpuCandidate, backend: TpuBackend) -> TpuConnection:
    """Connects and initializes a TPU once per process; later calls for the same address reuse it.

    A second `initialize_tpu_system` would wipe every variable already on the TPU.
    """
    # Every TfTpuBackend drives the same process-wide TF runtime, so all share one cache entry.
    key = DEFAULT_BACKEND if isinstance(backend, TfTpuBackend) else backend
    with _LOCK:
        connections = _CONNECTIONS.setdefault(key, {})
        if candidate.tpu in connections:
            return connections[candidate.tpu]
        resolver = backend.make_resolver(candidate.tpu, candidate.zone, candidate.project)
        backend.connect(resolver)
        backend.initialize(resolver)
        strategy = backend.make_strategy(resolver)
        connection = TpuConnection(candidate, resolver, strategy)
        connections[candidate.tpu] = connection
        return connection


def try_tpus(
    candidates: list[TpuCandidate], backend: TpuBackend
) -> tuple[TpuConnection | None, list[str]]:
    """The first candidate that connects, and one line per failed attempt (what, what it raised)."""
    failures = []
    for candidate in candidates:
        try:
            return connect_tpu(candidate, backend), failures
        except Exception as error:  # noqa: BLE001 - any failure is reported with the others
            failures.append(f"{_describe(candidate)}: raised {short_error(error)}")
            log.debug("no TPU at %s: %s", candidate.tpu, short_error(error))  # the caller reports them all
    return None, failures


def _describe(candidate: TpuCandidate) -> str:
    where = f"tpu={candidate.tpu!r}"
    if candidate.zone or candidate.project:
        where += f" zone={candidate.zone!r} project={candidate.project!r}"
    return f"{candidate.source}: {where}"


def short_error(error: BaseException, limit: int = 300) -> str:
    """First line of an exception, bounded: TF errors can carry pages of context."""
    text = (str(error).strip().splitlines() or [""])[0]
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def tpu_num_hosts(connection: TpuConnection) -> int:
    """Number of TPU hosts = input pipelines: the resolver's 'worker' tasks, else the strategy's count.

    A TPU VM ('local') resolver has an empty cluster spec; then TPUStrategy's system metadata knows.
    """
    spec = connection.resolver.cluster_spec()
    job = getattr(connection.resolver, "task_type", None) or "worker"
    if spec is not None and job in spec.jobs and spec.num_tasks(job) > 0:
        return spec.num_tasks(job)
    hosts = getattr(connection.strategy.extended, "num_hosts", None)
    return hosts if isinstance(hosts, int) and hosts > 0 else 1


def no_tpu_message(config: ClusterConfig, failures: list[str], notes: list[str], local: str | None = None,
                   tpu_name: str = "") -> str:
    """The error for 'a TPU was asked for (by config, or by the TPU_NAME env var: `tpu_name`), or this
    machine's is meant (`local`: why), and none connected': every attempt, then the fixes."""
    if local:
        why = local
    elif config.tpu:
        why = "cluster.tpu is set"
    elif config.accelerator == "tpu":
        why = "cluster.accelerator is 'tpu'"
    else:
        why = f"the TPU_NAME env var names {tpu_name!r}"
    lines = [f"no TPU found ({why}). Tried:"]
    lines += [f"  - {line}" for line in failures]
    lines += [f"  - {line}" for line in notes]
    if local:  # this process's TensorFlow can drive a TPU (tpu_stack.dead_end): what failed is above
        lines += [
            "Fix one of:",
            "  - stop the other process that holds the TPU, if the error above says so (sudo lsof -w /dev/accel* "
            "/dev/vfio/* names it; in Colab, Runtime > Restart session);",
            "  - or train on this machine's CPU or GPUs with cluster.accelerator=cpu (or gpu).",
        ]
        return "\n".join(lines)
    lines += [
        "Fix one of:",
        "  - set TPU_NAME (with TPU_ZONE and TPU_PROJECT) to your Cloud TPU's name, or pass "
        "cluster.tpu=<name | grpc://host:8470 | local>;",
        f"  - on a TPU VM, install the TPU TensorFlow: {install_lib.TPU_FIX}; then use cluster.tpu=local;",
        "  - in Colab, pick Runtime > Change runtime type > TPU;",
        "  - or train elsewhere with cluster.accelerator=auto (or gpu / cpu)." if not tpu_name else
        "  - or train without a TPU: cluster.accelerator=cpu (or gpu), or unset TPU_NAME.",
    ]
    return "\n".join(lines)

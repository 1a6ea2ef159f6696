"""tf.data service servers: TensorFlow's `DispatchServer` and `WorkerServer`, started, named and stopped.

We build on TensorFlow's engine and add what a person running it needs: one readable line per
event instead of TF's config dumps, a fault-tolerant dispatcher when a work directory is given,
timeouts short enough that a dead worker is noticed in seconds rather than TF's ten minutes,
and a clean stop on SIGTERM (what Kubernetes, systemd and GCE send) or Ctrl-C.

Both servers listen on every interface: TensorFlow's gRPC servers take a port but no bind
address. What a worker *advertises* (the address trainers connect to) is `localhost` unless
`--address` names this host, so by default only processes on the same machine read from it.
The service has no authentication: on Cloud, run it on a private network whose firewall admits
only the trainer hosts and the workers.
"""
from __future__ import annotations

import dataclasses
import signal
import threading
import time
from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.config.data import service_host_port
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.system import local_path

# A worker sends a heartbeat this often; the dispatcher drops a worker it has not heard from for
# WORKER_TIMEOUT_MS and tells the trainers' clients to stop waiting for it. TF's defaults (30 s,
# 10 min) leave a training job stalled for minutes when a worker VM disappears.
HEARTBEAT_INTERVAL_MS = 1_000
WORKER_TIMEOUT_MS = 10_000
# A job no consumer has used for JOB_GC_TIMEOUT_MS is deleted (checked every JOB_GC_CHECK_MS). A
# job keeps its workers busy until then: with TF's defaults (5 and 10 min) a finished or killed
# trainer's endless stream kept a worker at 1.3 cores for over 20 minutes here.
JOB_GC_TIMEOUT_MS = 30_000
JOB_GC_CHECK_MS = 5_000


@dataclasses.dataclass
class RunningServer:
    """A started server and how to describe it in one line."""

    role: str  # "dispatcher" | "worker"
    server: Any  # tf.data.experimental.service.DispatchServer | WorkerServer
    port: int
    description: str

    def stop(self) -> None:
        self.server.stop()


def dispatcher_address(value: str) -> str:
    """`host:port` from `grpc://host:port` or `host:port`; a clear error for anything else."""
    parts = service_host_port(value)
    if parts is None:
        raise ConfigError(f"dispatcher address {value!r}: expected host:port or grpc://host:port, "
                          "e.g. grpc://10.0.0.2:5050")
    return ":".join(parts)


def start_dispatcher(port: int = 0, work_dir: Optional[str] = None,
                     worker_timeout_ms: int = WORKER_TIMEOUT_MS) -> RunningServer:
    """A dispatcher on `port` (0: any free port). With `work_dir` it is fault tolerant: it journals
    its state there and a restarted dispatcher with the same work_dir resumes its jobs."""
    service = tf.data.experimental.service
    directory = local_path(work_dir, absolute=True) if work_dir else None
    config = service.DispatcherConfig(
        port=port, work_dir=directory, fault_tolerant_mode=directory is not None, worker_timeout_ms=worker_timeout_ms,
        job_gc_check_interval_ms=JOB_GC_CHECK_MS, job_gc_timeout_ms=JOB_GC_TIMEOUT_MS,
    )
    server = service.DispatchServer(config)
    bound = int(server.target.rsplit(":", 1)[1])
    mode = f"fault tolerant, journal in {directory}" if directory else "not fault tolerant (no --work_dir: a restart loses its jobs)"
    return RunningServer("dispatcher", server, bound, f"dispatcher on port {bound}, {mode}")


def start_worker(dispatcher: str, port: int = 0, address: Optional[str] = None,
                 heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS) -> RunningServer:
    """A worker on `port` registered with `dispatcher`; trainers reach it at `address` (default localhost)."""
    service = tf.data.experimental.service
    target = dispatcher_address(dispatcher)
    host = address or "localhost"
    config = service.WorkerConfig(
        dispatcher_address=target, worker_address=f"{host}:%port%", port=port,
        heartbeat_interval_ms=heartbeat_interval_ms,
    )
    server = service.WorkerServer(config)
    bound = int(server._address.rsplit(":", 1)[1])  # "localhost:PORT": the port TF bound (no public getter)
    return RunningServer("worker", server, bound, f"worker on port {bound}, advertised as {host}:{bound}, "
                                                       f"dispatcher {target}")


def serve_until_stopped(running: RunningServer, printer: Callable[[str], None] = print,
                        stop: Optional[threading.Event] = None) -> bool:
    """Blocks until SIGTERM or SIGINT (or `stop`), then stops the server. Returns False for a worker:
    the caller must then end the process (the serve command does, at once).

    TensorFlow's `WorkerServer.stop()` joins the worker's running tasks while holding the GIL:
    mid-epoch that took 18.8 s here, and nothing in the process (not even a timer thread) can cut
    it short. A worker keeps no state (the dispatcher notices it is gone after its timeout, as
    after a crash), so ending the process is the clean stop. A dispatcher runs no tasks and stops
    at once; with a work_dir it has journaled every change already.

    Signal handlers are installed only on the main thread (where Python delivers signals); a caller
    on another thread passes its own `stop` event.
    """
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda number, frame: stop.set())
    printer(f"serving: {running.description}; SIGTERM or Ctrl-C stops it")
    while not stop.wait(0.2):
        pass
    if running.role == "worker":  # the handlers stay: a second SIGTERM must not end it by the signal
        printer("stopped the worker (its running tasks end with the process)")
        return False
    started = time.perf_counter()
    running.stop()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    printer(f"stopped the {running.role} in {time.perf_counter() - started:.1f} s")
    return True

"""W1 (JPEG images) with and without the tf.data service, side by side in one run.

    python benchmarks/bench_service.py --rounds 5 --seconds 3 [--cache_dir DIR] [--json out.json]

Three arrangements of the same pipeline (`Pipeline.from_config(config).build()`, W1's config):
  no_service         the whole pipeline in this (the benchmark) process, as "ours" in bench_pipelines.py;
  service_1_worker   data.service.address=grpc://localhost:PORT of a dispatcher with ONE worker;
  service_2_workers  the same with its own dispatcher and TWO workers.
The dispatchers and workers are real separate processes (`python -m tpu_pipeline.cli serve ...`),
started afresh for each service measurement and stopped right after it (SIGTERM, then kill after
10 s). With 2+ cores, worker i of an arrangement is pinned to core i % ncores of this process's
affinity set (printed at start); the dispatchers and the consumer (this process) are not pinned.

Each round builds every arrangement afresh (in a rotated order), warms it up (--warmup batches; 40
covers each worker's first epoch, when it fills its record cache), calibrates on 3 batches, then
times about --seconds of batches. Ratios are taken within a round (same machine
state): service_1_worker / no_service, service_2_workers / no_service and 2_workers / 1_worker,
summarized as median and worst over rounds. Fresh servers per measurement, so that no job of an
earlier arrangement shares a worker. The CPU of the server processes during the timed part
is reported too (cores each worker used), which shows that every worker took part.

Caveat: the consumer runs on the same host as the workers. On a 2-core machine the workers compete
with the consumer (which still receives, decompresses and prefetches every batch) for the same two
cores, so service_2_workers shows the service's overhead and the scaling bound on one host, not what
two workers on other machines of a cluster would give.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

import workloads  # noqa: E402
from tpu_pipeline.bench.measure import Meter, available_cores  # noqa: E402
from tpu_pipeline.config import apply_overrides, config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402

NAMES = ["no_service", "service_1_worker", "service_2_workers"]
WORKERS = {"service_1_worker": 1, "service_2_workers": 2}
RATIOS = [("service_1_worker", "no_service"), ("service_2_workers", "no_service"),
          ("service_2_workers", "service_1_worker")]
READY_TIMEOUT_S = 120.0
WARMUP = 3  # W1's warm-up in bench_pipelines.py


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _preexec(core: Optional[int]) -> Callable[[], None]:
    """In the child: die with this process (PR_SET_PDEATHSIG=SIGTERM), and pin to `core` if given."""
    def setup() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if core is not None:
            os.sched_setaffinity(0, {core})
    return setup


class Server:
    """One `tpu_pipeline.cli serve` process; `start` waits for its "serving:" line."""

    def __init__(self, label: str, args: list[str], core: Optional[int] = None) -> None:
        self.label, self.core, self.role = label, core, args[0]
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.stderr = tempfile.TemporaryFile(mode="w+")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tpu_pipeline.cli", "serve", *args], cwd=ROOT, env=env,
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, preexec_fn=_preexec(core),
        )
        self.ps = psutil.Process(self.process.pid)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if "serving:" in line:
                self.ready.set()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stderr.seek(0)
                why = "exited" if self.process.poll() is not None else f"not ready after {READY_TIMEOUT_S:.0f} s"
                raise RuntimeError(f"{self.label} {why}:\n" + "\n".join(self.lines) + "\n" + self.stderr.read()[-4000:])

    def cpu_seconds(self) -> float:
        try:
            return sum(self.ps.cpu_times()[:2])
        except psutil.Error:
            return float("nan")

    def terminate(self) -> None:
        """One SIGTERM (a second one during the server's own stop would end it by the signal)."""
        if self.process.poll() is None and not getattr(self, "terminated", False):
            self.terminated = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self, deadline: float) -> str:
        """After `terminate`: wait until `deadline` (time.monotonic), then SIGKILL; says how it ended."""
        self.terminate()
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return f"{self.label}: killed (still running after SIGTERM)"
        return f"{self.label}: exit {self.process.returncode}"


def stop_all(servers: list[Server], timeout: float = 15.0) -> list[str]:
    """SIGTERM to every server (workers first), then wait for each; SIGKILL what outlives `timeout`."""
    ordered = [s for s in servers if s.role == "worker"] + [s for s in servers if s.role != "worker"]
    for server in ordered:
        server.terminate()
    deadline = time.monotonic() + timeout
    return [server.stop(deadline) for server in ordered]


def start_service(name: str, count: int, core_ids: list[int], servers: list[Server]) -> tuple[str, list[Server]]:
    """A fresh dispatcher and `count` workers (worker i pinned to core i % ncores with 2+ cores),
    each appended to `servers` as it starts (so the caller's finally stops even a half-started set)."""
    port = _free_port()
    dispatcher = Server(f"{name}/dispatcher", ["dispatcher", "--port", str(port)])
    servers.append(dispatcher)
    dispatcher.wait_ready()
    workers = []
    for index in range(count):
        core = core_ids[index % len(core_ids)] if len(core_ids) >= 2 else None
        worker = Server(f"{name}/worker{index}", ["worker", "--dispatcher", f"localhost:{port}"], core)
        servers.append(worker)
        workers.append(worker)
    for worker in workers:
        worker.wait_ready()
    return f"grpc://localhost:{port}", workers


def pinning(core_ids: list[int]) -> str:
    if len(core_ids) < 2:
        return f"nothing (only {len(core_ids) or 'unknown'} core(s)); the consumer (this process) not pinned"
    plan = [f"{name}/worker{i} -> core {core_ids[i % len(core_ids)]}" for name, n in WORKERS.items() for i in range(n)]
    return "; ".join(plan) + "; dispatchers and the consumer (this process) not pinned"


def timed(build: Callable[[], tf.data.Dataset], seconds: float, workers: list[Server], warmup: int = WARMUP) -> dict:
    """bench_pipelines.timed, plus the CPU the service's workers spent during the timed part."""
    meter = Meter(build())
    meter.warm_up(warmup)
    probe = meter.measure(3)
    batches = max(3, int(probe.batches_per_sec * seconds))
    before = [w.cpu_seconds() for w in workers]
    result = meter.measure(batches).as_dict()
    result["worker_cores_used"] = [(w.cpu_seconds() - b) / result["seconds"] for w, b in zip(workers, before)]
    del meter
    gc.collect()  # drop the iterator (and with it this consumer's service job) before the servers stop
    return result


def measure(name: str, build: Callable[[list[str]], Callable[[], tf.data.Dataset]], seconds: float,
            core_ids: list[int], servers: list[Server], service_overrides: list[str] = (), warmup: int = WARMUP) -> dict:
    """One arrangement: no_service in this process; a service one on freshly started servers, stopped
    right after (so no job of an earlier arrangement shares a worker)."""
    if name == "no_service":
        return timed(build([]), seconds, [], warmup)
    started = time.perf_counter()
    address, workers = start_service(name, WORKERS[name], core_ids, servers)
    ready = time.perf_counter() - started
    try:
        result = timed(build([f"data.service.address={address}", *service_overrides]), seconds, workers, warmup)
    finally:
        ours = [s for s in servers if s.label.startswith(name + "/")]
        result_stop = stop_all(ours, timeout=10.0)
        for server in ours:
            servers.remove(server)
    result.update(servers_ready_seconds=ready, servers_stopped=result_stop)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per arrangement per round")
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--json", default=None, help="write all measurements here")
    parser.add_argument("--warmup", type=int, default=WARMUP,
                        help="batches before timing; 40 covers the first epoch (record cache filling) on 2 workers")
    parser.add_argument("--service_override", action="append", default=[],
                        help="key=value applied to the service arrangements only, e.g. data.service.compression=none")
    args = parser.parse_args()

    workload = workloads.workload("w1_images", args.cache_dir)  # first use: writes the JPEG shards (a minute)
    workloads.files(workload.name, args.cache_dir)
    cores = available_cores()
    core_ids = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

    def build(overrides: list[str]) -> Callable[[], tf.data.Dataset]:
        config = config_from_dict(apply_overrides({"data": workload.config}, overrides)).data
        return lambda: Pipeline.from_config(config).build()

    servers: list[Server] = []  # the running ones, for the finally
    previous = signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # run the finally
    print("pinned: " + pinning(core_ids), flush=True)
    try:
        rounds: list[dict[str, dict]] = []
        for index in range(args.rounds):
            order = NAMES[index % len(NAMES):] + NAMES[: index % len(NAMES)]
            results = {name: measure(name, build, args.seconds, core_ids, servers, args.service_override, args.warmup) for name in order}
            rounds.append(results)
            rates = ", ".join(f"{n} {results[n]['examples_per_sec']:,.0f}/s" for n in NAMES)
            ratios = ", ".join(f"{a.replace('service_', '')}/{b.replace('service_', '')} "
                               f"{results[a]['examples_per_sec'] / results[b]['examples_per_sec']:.3f}"
                               for a, b in RATIOS)
            print(f"round {index + 1} (order {', '.join(order)}): {rates}; {ratios}", flush=True)
            stops = "; ".join(s for n in WORKERS for s in results[n]["servers_stopped"] if "exit 0" not in s)
            if stops:
                print(f"  servers not stopped cleanly by SIGTERM: {stops}", flush=True)
    finally:
        if servers:  # only after an error: each measurement stops its own servers
            print("servers stopped: " + "; ".join(stop_all(servers)), flush=True)
        signal.signal(signal.SIGTERM, previous)

    print(f"\n{workload.name}: {cores} cores, batch {workload.batch_size}, {args.rounds} rounds, ~{args.seconds:g} s each")
    print(f"{'arrangement':20s} {'median/s':>10s} {'min/s':>10s} {'consumer cpu us/ex':>19s} "
          f"{'consumer cores':>15s} {'worker cores':>14s}")
    for name in NAMES:
        rates = [r[name]["examples_per_sec"] for r in rounds]
        cpu = statistics.median(r[name]["cpu_seconds_per_example"] for r in rounds) * 1e6
        used = statistics.median(r[name]["cores_used"] for r in rounds)
        per_worker = [statistics.median(r[name]["worker_cores_used"][i] for r in rounds)
                      for i in range(WORKERS.get(name, 0))]
        workers_text = "+".join(f"{c:.2f}" for c in per_worker) or "-"
        print(f"{name:20s} {statistics.median(rates):10,.0f} {min(rates):10,.0f} {cpu:19.2f} {used:15.2f} {workers_text:>14s}")

    print("\nratios (per round, then median / worst):")
    summary = {}
    for candidate, reference in RATIOS:
        ratios = [r[candidate]["examples_per_sec"] / r[reference]["examples_per_sec"] for r in rounds]
        label = f"{candidate} / {reference}"
        summary[label] = {"median": statistics.median(ratios), "worst": min(ratios), "per_round": ratios}
        print(f"  {label:38s} median {statistics.median(ratios):6.3f}   worst {min(ratios):6.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"workload": workload.name, "cores": cores, "pinned": pinning(core_ids),
                       "rounds": rounds, "ratios": summary}, handle, indent=2)


if __name__ == "__main__":
    main()

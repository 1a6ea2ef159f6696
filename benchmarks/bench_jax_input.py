"""Keras 3 on JAX fed by our pipelines (issue 39, item 6): what the hand-off to `jax.Array`s costs, and
the input rate per host of ours against Keras 3's own tf.data adapter with 2 processes.

    .venv/bin/python benchmarks/bench_jax_input.py                       # both parts, a few minutes
    .venv/bin/python benchmarks/bench_jax_input.py --part handoff --rounds 5 --seconds 3
    .venv/bin/python benchmarks/bench_jax_input.py --part hosts --rounds 3 --seconds 6

Part 1, the hand-off (one process, 8 JAX CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=8,
KERAS_BACKEND=jax, both set here before JAX starts). The per-host dataset is our pipeline through
`resolve_jax(...).strategy.distribute_datasets_from_function` (per-replica batches joined into the
process batch; `.dataset` is the tf.data.Dataset inside the adapter it returns). Each round times, in a
rotated order, each build afresh:

  tf          the dataset iterated in Python, elements as tf tensors: the pipeline's own time per batch
  keras       the same dataset through Keras's JAX trainer's own input code: `JAXEpochIterator(x=dataset)`
              (which makes Keras's adapter with `get_data_adapter`) and its `_get_iterator()` (the
              trainer's distributed iterator: `TFDatasetAdapter.get_jax_iterator`, tf → numpy with
              `np.array`, then `_distribute_data` → `distribute_data_input` →
              `jax.make_array_from_process_local_data` with the distribution's data layouts), each step's
              arrays waited for (`block_until_ready`)
  ours        the same, `JAXEpochIterator(x=adapter)` given our adapter (cluster/jax_input.py: read-only
              `np.asarray` views, then the same Keras code): what `train` runs
  tf mem / numpy mem / keras mem / ours mem
              the same on 8 of those batches held in memory (`take(8).cache().repeat()`): the hand-off
              alone, with no pipeline threads beside it. keras mem - tf mem is Keras's hand-off per batch;
              numpy mem - tf mem its tf → numpy part (`np.array`: a copy); ours mem - tf mem ours.
  join mem    8 steps' per-replica batches held in memory, joined as they are pulled by
              `per_host_batches` (what our path adds on the host before Keras sees a batch: one copy
              of the process batch): join mem - tf mem is its cost per batch.

Part 2, the input rate per host with 2 real processes (jax.distributed on loopback, each process 4 CPU
devices: `resolve_jax(ClusterConfig(coordinator_address=..., num_processes=2, process_id=i, cpu_replicas=4))`)
on W1 (375x500 JPEGs decoded, cropped to 224, flipped: benchmarks/workloads.py), both paths carried to
global `jax.Array`s by the same Keras code as above, and each step's arrays reduced by one jitted
computation over all 8 devices of both processes (so the hosts step together, as training does):

  ours        each process builds its own shard: `JaxDataParallel.distribute_datasets_from_function`
              (our InputContext, 1 input pipeline per process; Keras's DataParallel with
              auto_shard_dataset=False, as resolve_jax sets it)
  keras       Keras 3's own adapter given the same pipeline unsharded (`Pipeline.build()`, the global
              batch) under `keras.distribution.DataParallel(devices=jax.devices())` (auto_shard_dataset
              left True): `distribute_dataset` rebatches to the process batch and `shard`s it, so every
              process runs the whole pipeline and keeps half of it.

Each child reports, as JSON on stdout, its steps, wall seconds and CPU seconds (resource.getrusage,
all its threads) over the timed steps; global examples/s = steps x global batch / wall (the hosts run
in lock step), CPU per global batch = a process's CPU seconds / steps. Rounds alternate which path
goes first. On a machine with fewer cores than the processes need, the two processes compete for the
same cores: the CPU seconds per global batch on each host are the figure that does not depend on the
core count; on real hosts, each with its own cores, the rate follows them. Part 2 runs first (its
children start before this process starts JAX with 8 devices); the tables print at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

DEVICE_FLAG = "--xla_force_host_platform_device_count"
HANDOFF_DEVICES = 8
HOST_PROCESSES, HOST_DEVICES = 2, 4
IN_MEMORY_BATCHES = 8
HANDOFF_NAMES = ("tf", "keras", "ours", "tf mem", "numpy mem", "keras mem", "ours mem", "join mem")
WORKLOADS = {  # name: what it is, for the table
    "demo": "demo images 64x64x3 float32, cached after epoch 1, flip",
    "tokens": "demo text, pack 1024, lm_shift (text_lm outputs)",
    "w1": "W1: 375x500 JPEG decode, crop 224, flip, bfloat16",
}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return usage.ru_utime + usage.ru_stime


def _with_device_count(flags: str, count: int) -> str:
    kept = [flag for flag in flags.split() if not flag.startswith(DEVICE_FLAG)]
    return " ".join(kept + [f"{DEVICE_FLAG}={count}"])


# --- the pipelines ---------------------------------------------------------------------------------

def data_config(workload: str, batch: Optional[int]) -> Any:
    """Our pipeline's DataConfig for a workload (the demo's, text_lm's, or benchmarks' W1)."""
    from tpu_pipeline.config import config_from_dict, load_config

    if workload == "demo":
        from tpu_pipeline.demo import demo_config
        return demo_config([f"data.batch_size={batch or 256}"]).data
    if workload == "tokens":
        from tpu_pipeline.records.demo_text import ensure_text_demo
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        return load_config(os.path.join(root, "configs", "text_lm.yaml"),
                           [f"data.source.dir={ensure_text_demo()}", "data.sequence.length=1024",
                            f"data.batch_size={batch or 32}"]).data
    import workloads
    w1 = workloads.workload("w1_images")
    return config_from_dict({"data": {**w1.config, "batch_size": batch or w1.batch_size}}).data


def warmup_batches(workload: str, config: Any) -> int:
    """At least this many batches before timing: the demo decodes and caches its first epoch."""
    if workload == "demo":
        return 4096 // config.batch_size + 4
    return 4


def nbytes(batch: Any) -> int:
    return sum(int(x.nbytes) if hasattr(x, "nbytes") else int(tf.size(x)) * x.dtype.size
               for x in tf.nest.flatten(batch))


# --- Keras's own input path -----------------------------------------------------------------------

def keras_iterator(dataset: tf.data.Dataset) -> Any:
    """The generator Keras's JAX trainer pulls each step from: JAXEpochIterator (get_data_adapter with the
    current distribution: `distribute_dataset`, i.e. rebatch + shard where auto_shard_dataset is set and
    there are several processes) and its distributed iterator (get_jax_iterator: tf → numpy; then
    `_distribute_data` → `distribute_data_input` → `jax.make_array_from_process_local_data`)."""
    from keras.src.backend.jax.trainer import JAXEpochIterator

    epoch_iterator = JAXEpochIterator(x=dataset, steps_per_epoch=1 << 40)
    return epoch_iterator._get_iterator()


def numpy_iterator(dataset: tf.data.Dataset) -> Any:
    """Only the tf → numpy half of Keras's path (TFDatasetAdapter.get_jax_iterator with no distribution step)."""
    from keras.src.trainers.data_adapters import get_data_adapter

    return get_data_adapter(dataset).get_jax_iterator()


# --- part 1: the hand-off, one process, 8 devices --------------------------------------------------

def handoff_round(workload: str, strategy: Any, config: Any, seconds: float, warmup: float,
                  order: list[str]) -> dict[str, dict]:
    import jax
    from tpu_pipeline.cluster.jax_devices import per_host_batches
    from tpu_pipeline.cluster.jax_input import host_batches
    from tpu_pipeline.pipeline import Pipeline

    def per_host() -> tf.data.Dataset:
        pipeline = Pipeline.from_config(config)
        return strategy.distribute_datasets_from_function(lambda context: pipeline.build(context)).dataset

    def pulls(name: str) -> Callable[[], Any]:
        if name == "join mem":  # per-replica batches in memory, joined by per_host_batches as we go
            pipeline = Pipeline.from_config(config)
            replicas = strategy.local_devices
            cached = pipeline.build(strategy.input_context()).take(IN_MEMORY_BATCHES * replicas).cache().repeat()
            iterator = iter(per_host_batches(cached, replicas))
            return lambda: next(iterator)
        dataset = per_host()
        if name.endswith(" mem"):
            dataset = dataset.take(IN_MEMORY_BATCHES).cache().repeat()
        if name.startswith(("keras", "ours")):
            iterator = keras_iterator(host_batches(dataset) if name.startswith("ours") else dataset)
            return lambda: jax.block_until_ready(next(iterator))
        iterator = numpy_iterator(dataset) if name.startswith("numpy") else iter(dataset)
        return lambda: next(iterator)

    out = {}
    for name in order:
        pull = pulls(name)
        first = pull()
        start, pulled = time.perf_counter(), 1
        least = warmup_batches(workload, config) if not name.endswith(" mem") else IN_MEMORY_BATCHES + 2
        while pulled < least or time.perf_counter() - start < warmup:
            pull()
            pulled += 1
        probe = time.perf_counter()
        for _ in range(3):
            pull()
        batches = max(5, int(seconds / max((time.perf_counter() - probe) / 3, 1e-6)))
        cpu, start = cpu_seconds(), time.perf_counter()
        for _ in range(batches):
            pull()
        elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        out[name] = {"batches": batches, "seconds": elapsed, "us_per_batch": elapsed / batches * 1e6,
                     "cpu_us_per_batch": cpu / batches * 1e6, "bytes": nbytes(first),
                     "shapes": [list(x.shape) for x in tf.nest.flatten(first)]}
        del pull
    return out


def run_handoff(args: argparse.Namespace) -> dict:
    os.environ["XLA_FLAGS"] = _with_device_count(os.environ.get("XLA_FLAGS", ""), HANDOFF_DEVICES)
    from tpu_pipeline.cluster.jax_devices import resolve_jax
    from tpu_pipeline.config.cluster import ClusterConfig

    info = resolve_jax(ClusterConfig(cpu_replicas=HANDOFF_DEVICES))
    strategy = info.strategy
    print(f"part 1, the hand-off: 1 process, {info.num_replicas} JAX CPU devices, {os.cpu_count()} cores; "
          f"{args.rounds} rounds, ~{args.seconds:g} s timed each", flush=True)
    results: dict[str, list[dict]] = {}
    for workload in args.handoff_workloads.split(","):
        config = data_config(workload, args.handoff_batch.get(workload))
        rounds = []
        for index in range(args.rounds):
            order = list(HANDOFF_NAMES[index % len(HANDOFF_NAMES):] + HANDOFF_NAMES[:index % len(HANDOFF_NAMES)])
            measured = handoff_round(workload, strategy, config, args.seconds, args.warmup, order)
            rounds.append(measured)
            print(f"  {workload} round {index + 1}: " + ", ".join(
                f"{name} {measured[name]['us_per_batch']:,.0f} us" for name in HANDOFF_NAMES), flush=True)
        results[workload] = rounds
    return {"devices": info.num_replicas, "rounds": results}


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def print_handoff(result: dict, args: argparse.Namespace) -> None:
    print(f"\nPart 1: the hand-off per batch, 1 process, {result['devices']} JAX CPU devices "
          f"(median (worst–best) of {args.rounds} rounds, each ratio taken within a round)")
    header = ("workload", "process batch", "bytes/batch", "pipeline µs/batch (tf)", "through Keras's adapter µs/batch",
              "through ours µs/batch", "Keras's ÷ pipeline time", "ours ÷ pipeline time", "Keras's hand-off alone µs",
              "of it tf→numpy µs", "our hand-off alone µs", "Keras's ÷ ours (hand-off)", "join (per_host_batches) µs")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for workload, rounds in result["rounds"].items():
        first = rounds[0]["tf"]
        handoff = [r["keras mem"]["us_per_batch"] - r["tf mem"]["us_per_batch"] for r in rounds]
        ours = [r["ours mem"]["us_per_batch"] - r["tf mem"]["us_per_batch"] for r in rounds]
        to_numpy = [r["numpy mem"]["us_per_batch"] - r["tf mem"]["us_per_batch"] for r in rounds]
        cells = [
            f"{workload}: {WORKLOADS[workload]}",
            " + ".join("x".join(str(d) for d in shape) for shape in first["shapes"]),
            f"{first['bytes'] / 2**20:.2f} MiB",
            spread([r["tf"]["us_per_batch"] for r in rounds], ",.0f"),
            spread([r["keras"]["us_per_batch"] for r in rounds], ",.0f"),
            spread([r["ours"]["us_per_batch"] for r in rounds], ",.0f"),
            spread([r["keras"]["us_per_batch"] / r["tf"]["us_per_batch"] for r in rounds], ".2f"),
            spread([r["ours"]["us_per_batch"] / r["tf"]["us_per_batch"] for r in rounds], ".2f"),
            spread(handoff, ",.0f"),
            spread(to_numpy, ",.0f"),
            spread(ours, ",.0f"),
            spread([h / max(o, 1.0) for h, o in zip(handoff, ours)], ".1f"),
            spread([r["join mem"]["us_per_batch"] - r["tf mem"]["us_per_batch"] for r in rounds], ",.0f"),
        ]
        print("| " + " | ".join(cells) + " |")


# --- part 2: 2 processes, ours against Keras's adapter ---------------------------------------------

def host_child(args: argparse.Namespace) -> None:
    """One process of part 2: prints RESULT {json}."""
    from tpu_pipeline.cluster.jax_devices import resolve_jax
    from tpu_pipeline.config.cluster import ClusterConfig
    from tpu_pipeline.pipeline import Pipeline

    info = resolve_jax(ClusterConfig(coordinator_address=f"127.0.0.1:{args.port}", num_processes=HOST_PROCESSES,
                                     process_id=args.process_id, cpu_replicas=HOST_DEVICES))
    import jax
    import jax.numpy as jnp
    import keras
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec

    config = data_config("w1", args.hosts_batch)
    pipeline = Pipeline.from_config(config)
    if args.child == "ours":
        dataset = info.strategy.distribute_datasets_from_function(lambda context: pipeline.build(context))
    else:
        distribution = keras.distribution.DataParallel(devices=jax.devices())  # auto_shard_dataset=True
        keras.distribution.set_distribution(distribution)
        dataset = pipeline.build()  # one input pipeline at the global batch: what a Keras user hands over
    iterator = keras_iterator(dataset)
    mesh = keras.distribution.distribution().device_mesh.backend_mesh
    # A stand-in for the training step that costs next to nothing: one value of each row of each array,
    # summed over all 8 devices of both processes (a cross-process computation: the hosts step together).
    reduce = jax.jit(lambda batch: sum(jnp.sum(x.reshape(x.shape[0], -1)[:, 0].astype(jnp.float32))
                                       for x in jax.tree_util.tree_leaves(batch)),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))

    def step() -> Any:
        batch = next(iterator)
        reduce(batch).block_until_ready()  # every device of both processes: the hosts step together
        return batch

    first = step()
    shapes = [list(x.shape) for x in jax.tree_util.tree_leaves(first)]
    local = [list(x.addressable_shards[0].data.shape) for x in jax.tree_util.tree_leaves(first)]
    for _ in range(args.host_warmup):
        step()
    probe = time.perf_counter()
    for _ in range(3):
        step()
    guess = max(16, int(args.seconds / max((time.perf_counter() - probe) / 3, 1e-6)))
    steps = int(multihost_utils.broadcast_one_to_all(jnp.int32(guess)))  # process 0's count, for both
    multihost_utils.sync_global_devices("timed")
    cpu, start = cpu_seconds(), time.perf_counter()
    for _ in range(steps):
        step()
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    print("RESULT " + json.dumps({
        "path": args.child, "process": jax.process_index(), "processes": jax.process_count(),
        "devices": len(jax.devices()), "local_devices": len(jax.local_devices()), "steps": steps,
        "seconds": elapsed, "cpu": cpu, "global_shapes": shapes, "device_shard_shapes": local,
        "global_batch": shapes[0][0]}), flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_pair(path: str, args: argparse.Namespace) -> dict:
    """Both processes of one path, started together; their RESULTs, or what failed."""
    port = free_port()
    env = dict(os.environ, XLA_FLAGS=_with_device_count(os.environ.get("XLA_FLAGS", ""), HOST_DEVICES),
               KERAS_BACKEND="jax")
    command = [sys.executable, os.path.abspath(__file__), "--child", path, "--port", str(port),
               "--seconds", str(args.seconds), "--host_warmup", str(args.host_warmup)]
    if args.hosts_batch:
        command += ["--hosts_batch", str(args.hosts_batch)]
    children = [subprocess.Popen(command + ["--process_id", str(i)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for i in range(HOST_PROCESSES)]
    outputs = []
    deadline = time.monotonic() + args.child_timeout
    for child in children:
        try:
            outputs.append(child.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for other in children:
                if other.poll() is None:
                    other.send_signal(signal.SIGKILL)
            outputs.append(child.communicate())
    results, errors = [], []
    for index, (child, (stdout, stderr)) in enumerate(zip(children, outputs)):
        line = next((l for l in stdout.splitlines() if l.startswith("RESULT ")), None)
        if child.returncode == 0 and line:
            results.append(json.loads(line[len("RESULT "):]))
        else:
            tail = [l for l in stderr.splitlines()
                    if l.strip() and not l.startswith(("I0000", "W0000", "WARNING: All"))]
            errors.append(f"process {index} (rc {child.returncode}): " + " / ".join(tail[-4:])[-900:])
    return {"results": results, "errors": errors}


def run_hosts(args: argparse.Namespace) -> dict:
    print(f"\npart 2, ours against Keras's adapter: {HOST_PROCESSES} processes x {HOST_DEVICES} JAX CPU devices on "
          f"{os.cpu_count()} cores (the processes share them), W1, {args.rounds} rounds, ~{args.seconds:g} s timed",
          flush=True)
    rounds = []
    for index in range(args.rounds):
        order = ["ours", "keras"] if index % 2 == 0 else ["keras", "ours"]
        measured = {path: run_pair(path, args) for path in order}
        rounds.append(measured)
        cells = []
        for path in ("ours", "keras"):
            m = measured[path]
            if m["errors"] or len(m["results"]) != HOST_PROCESSES:
                cells.append(f"{path} FAILED: {m['errors']}")
            else:
                cells.append(f"{path} {_global_rate(m):,.0f} ex/s, "
                             f"{statistics.mean(_cpu_per_batch(m)):.3f} CPU s/global batch per host")
        print(f"  round {index + 1}: " + "; ".join(cells), flush=True)
    return {"rounds": rounds}


def _global_rate(measured: dict) -> float:
    """Global examples/s made available to training: the slower host's (they step together)."""
    return min(r["steps"] * r["global_batch"] / r["seconds"] for r in measured["results"])


def _cpu_per_batch(measured: dict) -> list[float]:
    return [r["cpu"] / r["steps"] for r in sorted(measured["results"], key=lambda r: r["process"])]


def print_hosts(result: dict, args: argparse.Namespace) -> None:
    good = [r for r in result["rounds"]
            if all(not r[p]["errors"] and len(r[p]["results"]) == HOST_PROCESSES for p in ("ours", "keras"))]
    print(f"\nPart 2: input rate per host, {HOST_PROCESSES} processes (jax.distributed, loopback) x {HOST_DEVICES} "
          f"JAX CPU devices, W1, to global jax.Arrays each step (median (worst–best) of {len(good)} rounds)")
    for r in result["rounds"]:
        for path in ("ours", "keras"):
            for error in r[path]["errors"]:
                print(f"  {path} failed: {error}")
    if not good:
        return
    sample = {p: good[0][p]["results"][0] for p in ("ours", "keras")}
    print(f"  global arrays each step: {sample['ours']['global_shapes']}, each device holds "
          f"{sample['ours']['device_shard_shapes']} (ours), {sample['keras']['device_shard_shapes']} (Keras's adapter)")
    print(f"  NOTE: this machine has {os.cpu_count()} cores; both processes compete for them, so the wall rates "
          "depend on the core count; CPU s per global batch on each host does not.")
    header = ("path", "global examples/s", "global batches/s", "CPU s per global batch, host 0",
              "host 1", "cores busy, both hosts", "ours ÷ Keras, rate", "Keras ÷ ours, CPU per host")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path in ("ours", "keras"):
        rates = [_global_rate(r[path]) for r in good]
        batch = good[0][path]["results"][0]["global_batch"]
        cpu = [_cpu_per_batch(r[path]) for r in good]
        if path == "ours":
            ratio = spread([_global_rate(r["ours"]) / _global_rate(r["keras"]) for r in good], ".2f")
            cpu_ratio = spread([statistics.mean(_cpu_per_batch(r["keras"])) / statistics.mean(_cpu_per_batch(r["ours"]))
                                for r in good], ".2f")
        else:
            ratio = cpu_ratio = "1"
        label = ("ours: each host its own shard (InputContext), auto_shard_dataset=False" if path == "ours" else
                 "Keras's adapter: the whole pipeline on each host, rebatch + shard (auto_shard_dataset=True)")
        print("| " + " | ".join([label, spread(rates, ",.0f"), spread([x / batch for x in rates], ".2f"),
                                 spread([c[0] for c in cpu], ".3f"), spread([c[1] for c in cpu], ".3f"),
                                 spread([sum(x["cpu"] / x["seconds"] for x in r[path]["results"])
                                         for r in good], ".2f"),
                                 ratio, cpu_ratio]) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["handoff", "hosts", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timed seconds per measurement (part 1: each of its 7 ways; part 2: each path)")
    parser.add_argument("--warmup", type=float, default=1.0, help="part 1: warm-up seconds (and the demo's first epoch)")
    parser.add_argument("--handoff_workloads", default="demo,tokens", help="part 1: comma-separated, of demo,tokens,w1")
    parser.add_argument("--demo_batch", type=int, default=256, help="part 1: the demo's global batch")
    parser.add_argument("--tokens_batch", type=int, default=32, help="part 1: packed rows of 1024 per batch")
    parser.add_argument("--hosts_batch", type=int, default=None, help="part 2: W1's global batch (default W1's 128)")
    parser.add_argument("--host_warmup", type=int, default=5, help="part 2: steps before timing")
    parser.add_argument("--child_timeout", type=float, default=300.0)
    parser.add_argument("--json", default=None, help="write every measurement here")
    parser.add_argument("--child", choices=["ours", "keras"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--process_id", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        host_child(args)
        return
    if os.environ["KERAS_BACKEND"] != "jax":
        parser.error(f"KERAS_BACKEND={os.environ['KERAS_BACKEND']}: this benchmark is of the JAX backend")
    args.handoff_batch = {"demo": args.demo_batch, "tokens": args.tokens_batch}
    print("command: " + " ".join([os.path.relpath(sys.executable)] + sys.argv), flush=True)
    out: dict[str, Any] = {}
    if args.part in ("hosts", "both"):  # first: the children start before this process holds JAX's 8 devices
        out["hosts"] = run_hosts(args)
    if args.part in ("handoff", "both"):
        out["handoff"] = run_handoff(args)
    if "handoff" in out:
        print_handoff(out["handoff"], args)
    if "hosts" in out:
        print_hosts(out["hosts"], args)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=2)


if __name__ == "__main__":
    main()

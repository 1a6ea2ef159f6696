"""Our default pipeline vs. the seed, all-AUTOTUNE and InputReader baselines, side by side.

    python benchmarks/bench_pipelines.py --workload w1 --rounds 5
    python benchmarks/bench_pipelines.py --workload w2 --rounds 5 --variant nobatch:data.parse=per_example

Each round builds every pipeline afresh (in a rotated order), warms it up, then times it for about
--seconds; ratios are taken within a round (same machine state) and summarized as median and
worst over rounds. Ceiling (a): one thread on in-memory records x cores; (b): sequential read +
batch. Absolute rates mean little on a shared 2-core machine: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import baselines  # noqa: E402
import workloads  # noqa: E402
from tpu_pipeline.bench.ceilings import one_thread_work, records_in_memory, sequential_read  # noqa: E402
from tpu_pipeline.bench.measure import Meter, available_cores  # noqa: E402
from tpu_pipeline.config import apply_overrides, config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402


def timed(build: Callable[[], tf.data.Dataset], batch_size: int, seconds: float, warmup: int) -> dict:
    """Warm up, calibrate on a few batches, then time about `seconds` of batches."""
    meter = Meter(build())
    meter.warm_up(warmup)
    probe = meter.measure(3)
    batches = max(3, int(probe.batches_per_sec * seconds))
    return meter.measure(batches).as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["w1", "w2"], required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per pipeline per round")
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--skip", default="", help="comma-separated pipelines to leave out")
    parser.add_argument("--variant", action="append", default=[], help="NAME:key=value,key=value (extra 'ours' pipelines)")
    parser.add_argument("--json", default=None, help="write all measurements here")
    parser.add_argument("--isolate", action="store_true",
                        help="measure each pipeline of each round in a fresh process (no shared TF runtime or warm caches)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # --isolate's child: measure this one, print JSON
    args = parser.parse_args()

    workload = workloads.workload({"w1": "w1_images", "w2": "w2_small"}[args.workload], args.cache_dir)
    pattern = workloads.files(workload.name, args.cache_dir)
    cores = available_cores()

    def ours(overrides: list[str]) -> Callable[[], tf.data.Dataset]:
        config = config_from_dict(apply_overrides({"data": workload.config}, overrides)).data
        return lambda: Pipeline.from_config(config).build()

    base_config = config_from_dict({"data": workload.config}).data
    memory = records_in_memory(base_config, 512)
    warmup = 3 if args.workload == "w1" else 20  # W2: fill the 10k shuffle buffer first
    pipelines: dict[str, Callable[[], tf.data.Dataset]] = {
        "ours": ours([]),
        "ceiling_a_one_thread": lambda: one_thread_work(base_config, memory),
        "ceiling_b_read": lambda: sequential_read(base_config),
        "seed": lambda: baselines.seed_pipeline(pattern, workload),
        "all-AUTOTUNE": lambda: baselines.all_autotune_pipeline(pattern, workload),
        "InputReader": lambda: baselines.input_reader_pipeline(pattern, workload),
    }
    for variant in args.variant:
        name, _, overrides = variant.partition(":")
        pipelines[name] = ours([o for o in overrides.split(",") if o])
    for name in filter(None, args.skip.split(",")):
        pipelines.pop(name)

    if args.one is not None:
        print("RESULT " + json.dumps(timed(pipelines[args.one], workload.batch_size, args.seconds, warmup)))
        return

    def measure(name: str) -> dict:
        if not args.isolate:
            return timed(pipelines[name], workload.batch_size, args.seconds, warmup)
        command = [sys.executable, os.path.abspath(__file__), "--one", name, "--workload", args.workload,
                   "--seconds", str(args.seconds)] + (["--cache_dir", args.cache_dir] if args.cache_dir else [])
        command += [f"--variant={variant}" for variant in args.variant]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return json.loads(next(line for line in output.splitlines() if line.startswith("RESULT "))[len("RESULT "):])

    rounds: list[dict[str, dict]] = []
    names = list(pipelines)
    for index in range(args.rounds):
        order = names[index % len(names):] + names[: index % len(names)]
        results = {name: measure(name) for name in order}
        rounds.append(results)
        print(f"round {index + 1}: " + ", ".join(f"{n} {results[n]['examples_per_sec']:,.0f}/s" for n in names), flush=True)

    def rate(result: dict, name: str) -> float:
        value = result[name]["examples_per_sec"]
        return value * cores if name == "ceiling_a_one_thread" else value

    print(f"\n{workload.name}: {cores} cores, batch {workload.batch_size}, {args.rounds} rounds (ceiling a = one thread x {cores})")
    print(f"{'pipeline':24s} {'median/s':>10s} {'min/s':>10s} {'cpu us/ex':>10s} {'cores':>6s}")
    for name in names:
        rates = [rate(r, name) for r in rounds]
        cpu = statistics.median(r[name]["cpu_seconds_per_example"] for r in rounds) * 1e6
        used = statistics.median(r[name]["cores_used"] for r in rounds)
        print(f"{name:24s} {statistics.median(rates):10,.0f} {min(rates):10,.0f} {cpu:10.2f} {used:6.2f}")

    print("\nratios (per round, then median / worst):")
    summary = {}
    for candidate in [n for n in names if n == "ours" or n not in baselines.BASELINES and not n.startswith("ceiling")]:
        for reference in ["ceiling_a_one_thread", "ceiling_b_read", *baselines.BASELINES]:
            if reference not in names:
                continue
            ratios = [rate(r, candidate) / rate(r, reference) for r in rounds]
            label = f"{candidate} / {reference.replace('_one_thread', '').replace('_read', '')}"
            summary[label] = {"median": statistics.median(ratios), "worst": min(ratios)}
            print(f"  {label:36s} median {statistics.median(ratios):6.3f}   worst {min(ratios):6.3f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"workload": workload.name, "cores": cores, "rounds": rounds, "ratios": summary}, handle, indent=2)


if __name__ == "__main__":
    main()

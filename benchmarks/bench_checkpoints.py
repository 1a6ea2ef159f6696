"""What step checkpoints cost on the demos: train with them off and on, side by side.

`train.checkpoint_every_seconds: auto` (the default) saves every 60 s between epoch ends, so a
SIGKILL loses at most a minute of steps. This runs each demo as a user would (`tpu-pipeline train`,
a fresh process per run, rounds alternating off/on) with

  off   train.checkpoint_every_seconds=null   (epoch ends and SIGTERM only: the old default)
  on    the default (auto), or --seconds N

and prints, per demo and setting, the median over rounds of: seconds per training step
(train_seconds / steps, tracing, epoch-end evaluation and saves included), step checkpoints saved,
seconds per save (every save of the run, epoch ends included: all are the same save), and the share
of train_seconds the step checkpoints took (step_checkpoint_seconds in metrics.json, timed around
each save). The ratio on/off of seconds per step is the end-to-end figure; on a shared machine its
noise is larger than the saves' cost, so the timed share is the figure to quote.

Run: .venv/bin/python benchmarks/bench_checkpoints.py [--rounds 1] [--seconds 60] [--demos image,text]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CLI = [sys.executable, "-m", "tpu_pipeline.cli", "train"]
# Each demo's steps in ONE epoch: an epoch-end save also restarts the interval, and the demos' epochs
# (5-45 s here) are shorter than 60 s, so as shipped they make no step checkpoint at all; one long
# epoch is what a real run looks like to the interval (the warm-up kept at the same number of steps).
DEMOS = {
    # The image demo (scripts/run_demo.sh): twice its 12 epochs of 32 steps (once takes under 60 s here).
    "image": ["train.epochs=1", "train.steps_per_epoch=768", "model.schedule.warmup_epochs=0.0417"],
    # The text demo (configs/text_lm.yaml): its 4 epochs of 100 steps.
    "text": ["--config", os.path.join(REPO, "configs", "text_lm.yaml"), "train.epochs=1", "train.steps_per_epoch=400",
             "model.schedule.warmup_epochs=0.125"],
}


def run(demo: str, setting: list[str], run_dir: str) -> dict:
    """One `tpu-pipeline train` of `demo`; metrics.json plus the number of saves it printed."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([*CLI, *DEMOS[demo], f"train.run_dir={run_dir}", *setting], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{demo} {setting} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    saved = [line for line in done.stdout.splitlines() if line.startswith("saved checkpoint")]
    metrics["saves"] = len(saved)
    metrics["step_saves"] = sum("(every " in line for line in saved)
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=None, help="on: this interval instead of auto")
    parser.add_argument("--demos", default="image,text")
    args = parser.parse_args()
    settings = {"off": ["train.checkpoint_every_seconds=null"],
                "on": [] if args.seconds is None else [f"train.checkpoint_every_seconds={args.seconds:g}"]}
    on_name = "auto" if args.seconds is None else f"{args.seconds:g} s"
    print(f"{'demo':6} {'setting':10} {'s/step':>8} {'step saves':>10} {'s/save':>7} {'saves share':>11}  (median of "
          f"{args.rounds} round(s))")
    for demo in args.demos.split(","):
        results: dict[str, list[dict]] = {"off": [], "on": []}
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.rounds):
                order = ["off", "on"] if index % 2 == 0 else ["on", "off"]
                for name in order:
                    results[name].append(run(demo, settings[name], os.path.join(tmp, f"{name}{index}")))

        def median(name: str, fn) -> float:
            return statistics.median(fn(m) for m in results[name])

        per_step = {}
        for name in ("off", "on"):
            per_step[name] = median(name, lambda m: m["train_seconds"] / m["steps"])
            per_save = median(name, lambda m: m["checkpoint_seconds"] / max(m["saves"], 1))
            share = median(name, lambda m: m["step_checkpoint_seconds"] / m["train_seconds"])
            label = "off" if name == "off" else f"on ({on_name})"
            print(f"{demo:6} {label:10} {per_step[name]:8.4f} {median(name, lambda m: m['step_saves']):10.0f} "
                  f"{per_save:7.3f} {share:11.2%}")
        print(f"{demo:6} s/step on/off: {per_step['on'] / per_step['off']:.3f}")


if __name__ == "__main__":
    main()

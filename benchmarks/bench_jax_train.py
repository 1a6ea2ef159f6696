"""`tpu-pipeline train` on TensorFlow (tf_keras, tf.distribute) and on Keras 3 with JAX, side by side.

    .venv/bin/python benchmarks/bench_jax_train.py [--rounds 2] [--replicas 8] [--workloads image,text]
        [--lm_epochs 2] [--lm_steps 100] [--lm_data DIR] [--lm_eval_steps N] [--override KEY=VALUE ...] [--json out.json]

Each round runs the real training job once per framework, in a child process of its own, alternating
(TensorFlow first in even rounds, JAX first in odd ones): the same config, the same `train.seed`, the
same `cluster.cpu_replicas` (replicas of a MirroredStrategy, or JAX CPU devices), so both train on the
same batches in the same order (tests/test_jax_train.py checks that every device's slice of every step
is what the same replica gets on TensorFlow) for the same steps. Only the framework, and so the initial
weights, differ. From each run's metrics.json:

  image  the demo (configs/demo.yaml's CNN on the shapes): eval_accuracy and eval_loss
  text   configs/text_lm.yaml (packed rows of 256 bytes, the Transformer LM): eval_loss in nats per real
         token, eval_bits_per_byte; the issue's bar is |JAX - TF| <= 0.05 nats at equal steps
  both   steps/s of the timed training steps (metrics.json's examples_per_sec or rows_per_sec over the global
         batch: the time in training steps only, the first step of each fit, compilation, left out), the
         wall steps/s of the whole fit (train_seconds less checkpoint time: compilation and the epoch-end
         validations in), and input_wait_fraction

Round r uses train.seed=r for both frameworks (the batches' order and the initial weights change with it;
`--first_seed F` starts at F, to add seeds to an earlier run's),
so the spread over rounds is that of the seeds. The two frameworks draw different initial weights from one
seed; `--same_init` gives them the same: the TensorFlow run (first in every round then) saves its model's
weights as built, by name, and the JAX run's model takes them (a Keras 3 weight's path is its tf_keras
name), so the two differ only in how they compute.

Printed: each figure's median over the rounds (worst-best), and JAX / TF for steps/s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMEWORKS = ("tensorflow", "jax")


def overrides(workload: str, args: argparse.Namespace, run_dir: str, framework: str, seed: int) -> list[str]:
    common = [f"model.framework={framework}", f"train.run_dir={run_dir}", f"cluster.cpu_replicas={args.replicas}",
              f"train.seed={seed}", "train.tensorboard=false", "train.checkpoint_every_seconds=null", *args.override]
    if workload == "image":
        return common + [f"train.epochs={args.image_epochs}"]
    data = [f"data.source.dir={args.lm_data}", f"eval_data.source.dir={args.lm_data}"] if args.lm_data else []
    data += [f"train.eval_steps={args.lm_eval_steps}"] if args.lm_eval_steps else []
    return ["--config", os.path.join(REPO, "configs", "text_lm.yaml"), *common, *data,
            f"train.epochs={args.lm_epochs}", f"train.steps_per_epoch={args.lm_steps}"]


def run(workload: str, framework: str, args: argparse.Namespace, seed: int, weights: str = "") -> dict[str, Any]:
    """One training job in a fresh process; its metrics.json. `weights`: the initial weights' .npz (`--same_init`)."""
    with tempfile.TemporaryDirectory() as scratch:
        run_dir = os.path.join(scratch, "run")
        env = {key: value for key, value in os.environ.items() if key not in ("KERAS_BACKEND", "XLA_FLAGS")}
        start = [os.path.abspath(__file__), "--child", weights] if weights else ["-m", "tpu_pipeline.cli"]
        command = [sys.executable, *start, "train", *overrides(workload, args, run_dir, framework, seed)]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"{workload} on {framework} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    wall = metrics["train_seconds"] - metrics["checkpoint_seconds"]
    rate = metrics.get("examples_per_sec") or metrics["rows_per_sec"]
    figures = {"steps_per_sec": rate / metrics["global_batch_size"], "wall_steps_per_sec": metrics["steps"] / wall,
               "input_wait": metrics["input_wait_fraction"], "eval_loss": metrics["eval_loss"]}
    if workload == "image":
        figures["eval_accuracy"] = metrics["eval_accuracy"]
    else:
        figures.update(eval_bits_per_byte=metrics["eval_bits_per_byte"], tokens_per_sec=metrics["tokens_per_sec"])
    # Each epoch's training loss and validation loss: where two frameworks part, not only where they end.
    print(f"  {workload} {framework} per epoch: loss " + " ".join(f"{v:.3f}" for v in metrics["history"]["loss"])
          + " | val_loss " + " ".join(f"{v:.3f}" for v in metrics["history"].get("val_loss", [])), flush=True)
    return figures


def child(weights: str, argv: list[str]) -> None:
    """`tpu-pipeline train` whose model starts from `weights` (by weight name), saved first if not there yet."""
    import numpy as np

    sys.path.insert(0, REPO)
    from tpu_pipeline.cli import main as cli_main
    from tpu_pipeline.train import runner

    build_model = runner.build_model

    def same_start(*args: Any, **kwargs: Any) -> Any:
        model = build_model(*args, **kwargs)
        names = [getattr(w, "path", None) or w.name.removesuffix(":0") for w in model.weights]
        if os.path.exists(weights):
            saved = dict(np.load(weights))
            assert sorted(saved) == sorted(names), sorted(set(saved) ^ set(names))
            for name, weight in zip(names, model.weights):
                weight.assign(saved[name])
        else:
            np.savez(weights, **{name: np.asarray(w.numpy()) for name, w in zip(names, model.weights)})
        return model

    runner.build_model = same_start
    cli_main(["tpu-pipeline", *argv])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--first_seed", type=int, default=1,
                        help="the first round's train.seed; each next round adds 1 (more seeds for an earlier run)")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--workloads", default="image,text")
    parser.add_argument("--image_epochs", type=int, default=12)  # the demo's own: accuracy near its plateau
    parser.add_argument("--lm_epochs", type=int, default=2)
    parser.add_argument("--lm_steps", type=int, default=100)
    parser.add_argument("--lm_data", default=None, help="a `convert --from text` output directory instead of the demo text")
    parser.add_argument("--lm_eval_steps", type=int, default=None, help="validation steps (default: the whole split)")
    parser.add_argument("--override", action="append", default=[], help="a config override for both frameworks (repeatable)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--same_init", action="store_true", help="both frameworks start from the same weights")
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2], sys.argv[3:])
    args = parser.parse_args()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for workload in args.workloads.split(","):
        results[workload] = {framework: [] for framework in FRAMEWORKS}
        for round_ in range(args.rounds):
            order = FRAMEWORKS if round_ % 2 == 0 or args.same_init else FRAMEWORKS[::-1]
            weights = os.path.join(tempfile.mkdtemp(), "initial.npz") if args.same_init else ""
            for framework in order:
                figures = run(workload, framework, args, seed=args.first_seed + round_, weights=weights)
                results[workload][framework].append(figures)
                print(f"{workload} round {round_ + 1} {framework}: " + ", ".join(
                    f"{key} {value:.4f}" for key, value in figures.items()), flush=True)
    print(f"\n{' '.join(sys.argv)}\n")
    for workload, by_framework in results.items():
        keys = list(by_framework["tensorflow"][0])
        print(f"{workload}: median (worst-best) over {args.rounds} round(s), {args.replicas} replicas")
        for key in keys:
            tf_values = [r[key] for r in by_framework["tensorflow"]]
            jax_values = [r[key] for r in by_framework["jax"]]
            line = f"  {key:20s} tensorflow {spread(tf_values)}  jax {spread(jax_values)}"
            if key in ("steps_per_sec", "wall_steps_per_sec", "tokens_per_sec"):
                ratios = [j / t for j, t in zip(jax_values, tf_values)]
                line += f"  jax/tf {spread(ratios)}"
            if key == "eval_loss":
                differences = [j - t for j, t in zip(jax_values, tf_values)]
                line += f"  jax-tf {statistics.median(differences):+.4f} nats ({min(differences):+.4f} to {max(differences):+.4f})"
            print(line)
    if args.json:
        json.dump(results, open(args.json, "w"), indent=2)


if __name__ == "__main__":
    main()

"""Peak memory of the packed text pipeline on long documents: bounded by configuration, not by the data.

    .venv/bin/python benchmarks/bench_memory.py                  # one 30 MB document; a 10 MB corpus
    PYTHONPATH=$OLD_TREE .venv/bin/python $OLD_TREE/benchmarks/bench_memory.py --cap-gb 4   # another tree

Runs `tpu-pipeline demo --config configs/text_lm.yaml data.source.dir=<corpus> --steps N` (the
command a user runs; its data section: lm_shift, pack to 256 with overflow split, shuffle buffer
4096 records) in a child process per corpus (benchmarks/long_documents.py, converted once by
`tpu-pipeline convert --from text`), and samples the child's resident memory every 50 ms (psutil)
until it exits: the peak RSS, and what the demo printed. A child past --cap-gb is killed (so the
package before issue 25, whose windows held whole documents, cannot take the machine down) and
reported as such.

For scale: the child's baseline is TensorFlow itself (~0.6-0.8 GB once imported and a dataset
built); a parsed document costs 8 bytes per token in each of inputs and targets.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402

from long_documents import REPO, corpus  # noqa: E402

CORPORA = ("one_30mb", "corpus_10mb")


def peak_rss(command: list[str], cap_bytes: int, timeout: float) -> tuple[int, int, str]:
    """(peak RSS in bytes, exit code or -9 when killed at the cap or the timeout, the output's last line)."""
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    process = psutil.Process(child.pid)
    peak, deadline = 0, time.monotonic() + timeout
    while child.poll() is None:
        try:
            peak = max(peak, process.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        if peak > cap_bytes or time.monotonic() > deadline:
            child.kill()
            break
        time.sleep(0.05)
    output = child.communicate()[0]
    lines = [line for line in output.splitlines() if line.strip() and "I0000" not in line and "E0000" not in line]
    return peak, child.returncode, (lines[-1] if lines else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cap-gb", type=float, default=8.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--corpora", default=",".join(CORPORA))
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for the demo")
    args = parser.parse_args()
    cli = os.path.join(os.path.dirname(sys.executable), "tpu-pipeline")
    print(f"{'corpus':12s} {'peak RSS':>10s}  exit  what the demo printed last")
    for name in args.corpora.split(","):
        directory = corpus(name)
        command = [cli, "demo", "--config", os.path.join(REPO, "configs", "text_lm.yaml"),
                   f"data.source.dir={directory}", "--steps", str(args.steps), *args.overrides]
        peak, code, last = peak_rss(command, int(args.cap_gb * 2**30), args.timeout)
        killed = " (killed: over the cap or the timeout)" if code in (-9, 137) else ""
        print(f"{name:12s} {peak / 2**30:8.2f} GB  {code:4d}  {last[:110]}{killed}")


if __name__ == "__main__":
    main()

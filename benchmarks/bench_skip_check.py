"""The one-off price of `data.on_error: skip`: checking every record before the first epoch.

    rm -rf ~/.cache/tpu_pipeline/verified      # (or $TPU_PIPELINE_CACHE/verified) to time a first check
    .venv/bin/python benchmarks/bench_skip_check.py w1_images w2_small

Prints, per workload, the seconds `Pipeline.from_config` took with `on_error: skip` the first time
(the check) and the second time (its cached result).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from workloads import workload  # noqa: E402

from tpu_pipeline.config import config_from_dict  # noqa: E402
from tpu_pipeline.pipeline import Pipeline  # noqa: E402


def main(names: list[str]) -> None:
    for name in names or ["w1_images", "w2_small"]:
        config = config_from_dict({"data": dict(workload(name).config, on_error="skip")}).data
        started = time.perf_counter()
        pipeline = Pipeline.from_config(config)
        first = time.perf_counter() - started
        started = time.perf_counter()
        Pipeline.from_config(config)
        again = time.perf_counter() - started
        report = pipeline.skipped
        print(f"{name}: first check {first:.1f} s, from the cache {again:.2f} s; "
              f"{report.total:,} records, {report.skipped} left out", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

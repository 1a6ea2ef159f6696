"""A PNG bar chart of per-stage rates next to the pipeline and its ceilings (matplotlib, optional)."""
from __future__ import annotations

from typing import Any

from tpu_pipeline.errors import ConfigError


def stage_chart(diagnosis: Any, path: str) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--chart needs matplotlib: pip install 'tpu_pipeline[notebook]' (or matplotlib)") from None
    names = [s.name for s in diagnosis.stages]
    rates = [s.examples_per_sec for s in diagnosis.stages]
    figure, axis = plt.subplots(figsize=(9, 0.45 * len(names) + 2.2))
    axis.barh(names, rates, color="#4c72b0", label="stage alone, one thread")
    axis.axvline(diagnosis.pipeline.examples_per_sec, color="#dd8452", lw=2, label="pipeline as configured")
    axis.axvline(diagnosis.ceilings.compute_bound, color="#55a868", ls="--", label="ceiling (a) compute-bound")
    if diagnosis.ceilings.read_bound:
        axis.axvline(diagnosis.ceilings.read_bound, color="#c44e52", ls=":", label="ceiling (b) read-bound")
    if diagnosis.tuned:
        axis.axvline(diagnosis.tuned.examples_per_sec, color="#8172b3", lw=2, label="tuned pipeline")
    axis.set_xscale("log")
    axis.set_xlabel("examples / second (log scale)")
    axis.invert_yaxis()
    axis.legend(loc="lower right", fontsize=8)
    axis.set_title(f"bottleneck: {diagnosis.bottleneck[:90]}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path

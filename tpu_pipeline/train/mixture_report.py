"""What `train` says of a mixture: the rates each source was delivered at, beside its weight, and loss per source.

The counts come from a `SourceMeter` on the training pipeline (each example carries its source,
`_source`, up to the outputs), so they are what the batches held, not what the weights asked for.
Evaluation per source runs the evaluation mixture once per source with the other weights at 0: the
same records, parse, preprocessing and packing as the mixture's, one source at a time.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tpu_pipeline.config import Config
from tpu_pipeline.config.mixture import MixtureConfig
from tpu_pipeline.pipeline.mixtures.share_meter import mixture_counts


def mixture_figures(mixture: MixtureConfig, examples: Sequence[int], tokens: Sequence[int],
                    counted_from_step: int) -> dict[str, Any]:
    """metrics.json's `mixture`: per source what the training batches held (`mixture_counts`), counted from
    `counted_from_step` (where this process started or resumed)."""
    return {"weight_by": mixture.weight_by, "counted_from_step": counted_from_step,
            "sources": mixture_counts(mixture, examples, tokens)}


def one_source(config: Config, index: int) -> Config:
    """`config` with eval_data's mixture weighing source `index` only (the others at 0: never chosen)."""
    mixture = config.eval_data.mixture
    sources = [entry.model_copy(update={"weight": 1.0 if at == index else 0.0}) for at, entry in enumerate(mixture.sources)]
    eval_data = config.eval_data.model_copy(update={"mixture": mixture.model_copy(update={"sources": sources})})
    return config.model_copy(update={"eval_data": eval_data})


def evaluate_by_source(config: Config, evaluate: Callable[[Config], dict[str, float]],
                       printer: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """eval_data a mixture: `evaluate(config)` (train's exact evaluation of config.eval_data, its
    `eval_*` figures) once per source; printed in one line, returned by source name."""
    mixture = config.eval_data.mixture
    figures = {entry.name: evaluate(one_source(config, index)) for index, entry in enumerate(mixture.sources)}
    printer("evaluation by source: " + ", ".join(
        f"{name} eval_loss {values['eval_loss']:.4f}" for name, values in figures.items()))
    return figures

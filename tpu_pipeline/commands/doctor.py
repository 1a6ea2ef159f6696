"""`tpu-pipeline doctor --config FILE [--write-tuned tuned.yaml] [--json out.json] [--chart stages.png]`.

Measures each stage alone, both ceilings and the pipeline, names the bottleneck, proposes config
changes (measured side by side in the same run) and can write the tuned config. When this host's
CPUs are the limit and the config's last training run (train.run_dir/metrics.json) waited for
input, it says how many tf.data service worker cores would feed the accelerator.

The pipeline is measured as `demo` and `bench` measure it (`bench.measure`; its `measured:` line
says what the figure covers). With a `model:` section in the config, it also times a few training
steps of that model on this host (built as `train` builds it; `train.step_rate`) and compares: when
the input delivers several times what the model consumes, it says there is nothing to tune.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

import yaml
from absl import flags

from tpu_pipeline.commands._common import load_raw
from tpu_pipeline.config.loader import apply_overrides
from tpu_pipeline.errors import ConfigError, TpuPipelineError

flags.DEFINE_string("write-tuned", None, "write the whole config with the proposed changes applied here (YAML)")
if "json" not in flags.FLAGS:  # verify defines the same flag; a process may import both
    flags.DEFINE_string("json", None, "write the diagnosis (or report) here as JSON, for scripts")
flags.DEFINE_string("chart", None, "write a PNG chart of per-stage rates here")
flags.DEFINE_enum("section", "data", ["data", "eval_data"], "which pipeline of the config")
flags.DEFINE_integer("batches", 20, "batches per timed run of the whole pipeline")
flags.DEFINE_boolean("model", True, "with a model: section, time a few training steps of the config's model on this "
                     "host and compare its rate with the input's (--nomodel: the input pipeline only)")
flags.DEFINE_integer("model_steps", 5, "training steps of the model to time (after two untimed ones: compilation)")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.bench.doctor import diagnose, service_advice
    from tpu_pipeline.train.run_files import metrics_path, read_metrics

    raw, config = load_raw(overrides, check_accelerator=True)  # a TPU this TF cannot drive: one line, first
    data = getattr(config, FLAGS.section)
    if data is None:
        raise ConfigError(f"the config has no '{FLAGS.section}' section to diagnose")
    diagnosis = diagnose(data, batches=FLAGS.batches)
    untimed = None
    if FLAGS.model and FLAGS.section == "data" and raw.get("model") and config.data is not None:
        try:
            diagnosis = dataclasses.replace(diagnosis, model=_model_rate(config))
        except TpuPipelineError as error:  # the input's diagnosis stands without it
            untimed = f"model: not timed ({error}); the input pipeline's figures above stand alone"
    print(diagnosis.table())
    if untimed:
        print(untimed)
    training = read_metrics(config.train.run_dir) if FLAGS.section == "data" else None
    advice = service_advice(diagnosis, training)
    if advice:
        source = f" (from {metrics_path(config.train.run_dir)})" if training else ""
        print(f"more cores{source}: {advice}")
    section_overrides = [FLAGS.section + o[len("data"):] for o in diagnosis.tuned_overrides]
    if FLAGS["write-tuned"].value:
        tuned = apply_overrides(raw, section_overrides)
        with open(FLAGS["write-tuned"].value, "w") as handle:
            handle.write(f"# tpu-pipeline doctor: {', '.join(section_overrides) or 'no changes'}\n")
            yaml.safe_dump(tuned, handle, sort_keys=False)
        print(f"wrote the tuned config to {FLAGS['write-tuned'].value}")
    if FLAGS.json:
        with open(FLAGS.json, "w") as handle:
            json.dump({"section": FLAGS.section, **diagnosis.as_dict(), "tuned_overrides": section_overrides}, handle, indent=2)
    if FLAGS.chart:
        from tpu_pipeline.bench.chart import stage_chart

        stage_chart(diagnosis, FLAGS.chart)
        print(f"wrote the chart to {FLAGS.chart}")
    return 0


def _model_rate(config: Any) -> Any:
    """The config's model's training rate on this host (input from memory), as doctor reports it."""
    from tpu_pipeline.bench.doctor import ModelRate
    from tpu_pipeline.train.step_rate import model_step_rate

    rate = model_step_rate(config, steps=FLAGS.model_steps)
    return ModelRate(rate.steps_per_sec, rate.steps, rate.seconds, rate.warmup_seconds, rate.device)

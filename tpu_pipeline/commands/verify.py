"""`tpu-pipeline verify --config FILE [--json report.json] [key=value ...]`.

Reads every record of the config's `data` and `eval_data` sources once and prints a table of
faults by kind and file (token ids against the dataset's tokenizer, else model.transformer.vocab_size);
exits 1 when it finds any, so a script can refuse to start training.
"""
from __future__ import annotations

import json
from typing import Sequence

from absl import flags

from tpu_pipeline.commands._common import load

if "json" not in flags.FLAGS:  # doctor defines the same flag; a process may import both
    flags.DEFINE_string("json", None, "write the report here as JSON, for scripts")
FLAGS = flags.FLAGS


def run(overrides: Sequence[str]) -> int:
    from tpu_pipeline.verify import config_vocabulary, verify_data

    config = load(overrides)
    reports = []
    for section in ("data", "eval_data"):
        data = getattr(config, section)
        if data is not None:
            report = verify_data(data, section, num_classes=config.train.num_classes, workers=FLAGS.workers or None,
                                 vocab=config_vocabulary(config))
            print(report.table())
            reports.append(report)
    if FLAGS.json:
        with open(FLAGS.json, "w") as handle:
            json.dump([r.as_dict() for r in reports], handle, indent=2)
        print(f"wrote the report to {FLAGS.json}")
    return 1 if any(r.faults for r in reports) else 0

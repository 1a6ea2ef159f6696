"""Measuring input pipelines: throughput, ceilings, and the doctor. Uses the pipeline layer only."""
from tpu_pipeline.bench.ceilings import Ceilings, measure_ceilings
from tpu_pipeline.bench.doctor import Diagnosis, diagnose
from tpu_pipeline.bench.measure import Measurement, measure, summarize

__all__ = ["Ceilings", "Diagnosis", "Measurement", "diagnose", "measure", "measure_ceilings", "summarize"]

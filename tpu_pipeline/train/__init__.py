"""The training job: ties cluster, pipeline and model together (the only layer that does)."""
from tpu_pipeline.train.runner import train, write_metrics

__all__ = ["train", "write_metrics"]

"""The training job: ties cluster, pipeline and model together (the only layer that does)."""
from tpu_pipeline.train.runner import load_model, train

__all__ = ["load_model", "train"]

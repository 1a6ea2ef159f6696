"""Writing TFRecord shards and their metadata; the built-in demo dataset. No pipeline code here."""
from tpu_pipeline.records.demo_shapes import CLASS_NAMES, ensure_demo_dataset
from tpu_pipeline.records.writer import read_metadata, write_metadata, write_split

__all__ = ["CLASS_NAMES", "ensure_demo_dataset", "read_metadata", "write_metadata", "write_split"]

"""The dataset format: what a converted dataset directory holds (metadata.json, shard names, the
tokenizer of a text dataset) and what TFDS tells about a prepared dataset. A leaf that `records`
(which writes datasets) and `pipeline` (which reads them) both import, so neither imports the other.
"""
from tpu_pipeline.format.info import DatasetInfo
from tpu_pipeline.format.metadata import (
    DEFAULT_SPLIT, METADATA_FILE, dir_features, load_dataset_dir, read_dataset_metadata, read_metadata, shard_name,
    write_metadata,
)
from tpu_pipeline.format.tokenizer import BYTE_OFFSET, Tokenizer, dataset_tokenizer, load_tokenizer

__all__ = [
    "BYTE_OFFSET", "DEFAULT_SPLIT", "DatasetInfo", "METADATA_FILE", "dir_features", "load_dataset_dir", "read_dataset_metadata",
    "read_metadata", "shard_name", "Tokenizer", "dataset_tokenizer", "load_tokenizer", "write_metadata",
]

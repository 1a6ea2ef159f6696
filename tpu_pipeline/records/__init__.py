"""Writing TFRecord shards and their metadata: converters from image folders, CSV, NumPy, TFDS and
text, and the built-in demo dataset. No pipeline code here.

Source modules (image_folder, csv_input, numpy_input, tfds_reader) are imported by whoever uses
them, so `import tpu_pipeline` never pays for tensorflow_datasets. TextSource is exported (it needs
nothing more than the converter; sentencepiece is loaded only for an spm: tokenizer).
"""
from tpu_pipeline.records.convert import ConvertOptions, ConvertResult, convert
from tpu_pipeline.records.convert_input import ItemError
from tpu_pipeline.records.demo_shapes import CLASS_NAMES, ensure_demo_dataset
from tpu_pipeline.format import read_metadata, write_metadata
from tpu_pipeline.records.text_input import TextSource
from tpu_pipeline.records.writer import write_split

__all__ = [
    "CLASS_NAMES", "ConvertOptions", "ConvertResult", "ItemError", "convert", "ensure_demo_dataset",
    "read_metadata", "TextSource", "write_metadata", "write_split",
]

"""Which vocabulary token ids are checked against: the config's (the one `train` sizes the model by) and
each file's own dataset tokenizer (the metadata.json beside it, where that metadata lists the file).

`config_vocabulary(config)` follows `format.vocabulary.model_vocabulary`'s order (model.transformer.vocab_size,
else train.num_classes when train.task predicts tokens): `train`, `verify` and a pipeline's data-error
naming all pass it to `record_check.FileChecker`, with `dataset_vocabularies(files)`, so an id `verify`
passes fits the embedding.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.format.metadata import read_metadata
from tpu_pipeline.format.vocabulary import Vocabulary, model_vocabulary, tokenizer_vocabulary


def config_vocabulary(config: Any) -> Optional[Vocabulary]:
    """A whole config's token vocabulary (`format.vocabulary.model_vocabulary` without a tokenizer):
    model.transformer.vocab_size, else train.num_classes when train.task predicts tokens (the next
    token is the class); None when neither says."""
    transformer = getattr(getattr(config, "model", None), "transformer", None)
    train = getattr(config, "train", None)
    return model_vocabulary(getattr(transformer, "vocab_size", None), getattr(train, "num_classes", None),
                            predicts_tokens(getattr(train, "task", "")))


def _listed_files(metadata: Optional[Mapping[str, Any]]) -> set[str]:
    splits = (metadata or {}).get("splits") or {}
    return {name for entry in splits.values() if isinstance(entry, Mapping) for name in entry.get("files") or []}


def _read_metadata(directory: str) -> Optional[dict[str, Any]]:
    try:
        return read_metadata(directory)
    except (OSError, ValueError, tf.errors.OpError):
        return None  # not a converted dataset's metadata: no vocabulary from it


def dataset_vocabularies(files: Sequence[str]) -> dict[str, Optional[Vocabulary]]:
    """Each file's vocabulary from the metadata.json beside it, when that metadata lists the file
    (a glob over a converted dataset's shards included); None where none says."""
    by_dir: dict[str, Optional[dict[str, Any]]] = {}
    found: dict[str, Optional[Vocabulary]] = {}
    for path in files:
        directory, name = os.path.split(path)
        if directory not in by_dir:
            by_dir[directory] = _read_metadata(directory)
        metadata = by_dir[directory]
        found[path] = tokenizer_vocabulary(metadata) if name in _listed_files(metadata) else None
    return found

"""The vocabulary of token ids: which size bounds them, decided once for `train` and `verify` alike.

A language model is built with one vocabulary, and every id it reads must fit it. In this order:

1. `model.transformer.vocab_size`: the rows of the token embedding, when set;
2. `train.num_classes`, when the task predicts tokens: the logits' width (targets are input ids, so
   it is the vocabulary; a config that sets both to different sizes is refused at load);
3. the dataset's tokenizer, `vocab_size` in its metadata.json (what `convert --from text` writes).

`model_vocabulary` is that order: `train` sizes the model with it, and `verify` bounds ids with it.
`verify` also holds each file to its own dataset's tokenizer when that is smaller (`checked_vocabulary`):
an id past the tokenizer fits a wider embedding but was not made by the tokenizer.
Plain values in, so that the pipeline layer (record checks) and the train layer both call it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

METADATA_TOKENIZER = "metadata.json tokenizer"
VOCAB_SIZE_KEY = "model.transformer.vocab_size"
NUM_CLASSES_KEY = "train.num_classes"


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The bound of token ids (0..size-1) and the key it comes from, which the fix of a fault names."""

    size: int
    origin: str = "vocab given"  # METADATA_TOKENIZER, VOCAB_SIZE_KEY, NUM_CLASSES_KEY

    def fix(self) -> str:
        if self.origin == METADATA_TOKENIZER:
            return (f"the ids do not come from this dataset's tokenizer (its metadata.json says vocab_size "
                    f"{self.size}): convert again with the right tokenizer")
        if self.origin == NUM_CLASSES_KEY:
            return ("convert again with the right tokenizer, or set model.transformer.vocab_size to its vocabulary "
                    "size (train.num_classes stands for it only when unset)")
        if self.origin == VOCAB_SIZE_KEY:
            return "convert again with the right tokenizer, or set model.transformer.vocab_size to its vocabulary size"
        return "convert again with the right tokenizer, or give its vocabulary size"


def tokenizer_vocabulary(metadata: Optional[Mapping[str, Any]]) -> Optional[Vocabulary]:
    """metadata.json's `tokenizer.vocab_size` (what `convert --from text` writes); None when absent."""
    tokenizer = (metadata or {}).get("tokenizer")
    size = tokenizer.get("vocab_size") if isinstance(tokenizer, Mapping) else None
    return Vocabulary(size, METADATA_TOKENIZER) if isinstance(size, int) and size > 0 else None


def model_vocabulary(vocab_size: Optional[int], num_classes: Optional[int], predicts_tokens: bool,
                     tokenizer: Optional[Vocabulary] = None) -> Optional[Vocabulary]:
    """The vocabulary the model is built with: `vocab_size` (model.transformer.vocab_size), else
    `num_classes` (train.num_classes) when the task predicts tokens, else the dataset's `tokenizer`;
    None when none says (a class count is no vocabulary)."""
    if vocab_size:
        return Vocabulary(int(vocab_size), VOCAB_SIZE_KEY)
    if predicts_tokens and num_classes:
        return Vocabulary(int(num_classes), NUM_CLASSES_KEY)
    return tokenizer


def checked_vocabulary(model: Optional[Vocabulary], dataset: Optional[Vocabulary]) -> Optional[Vocabulary]:
    """The bound a file's ids are checked against: the model's vocabulary (`model_vocabulary` without a
    tokenizer, i.e. the config's) and the file's dataset's tokenizer, the smaller where both are known
    (an id must fit the model and come from the tokenizer); the tokenizer on a tie, as it is the data's."""
    if model is None or dataset is None:
        return dataset or model
    return model if model.size < dataset.size else dataset

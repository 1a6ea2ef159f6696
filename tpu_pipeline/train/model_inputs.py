"""What a model takes from the data, checked before the first step: one line naming data.outputs, not a trace.

A model needs static shapes and (inputs, targets); a language model needs a target token per
position and weights that leave padding out; an evaluation must feed the model trained on `data`.
`train` (and `step_rate`, which builds the same model) read the input shape from here.
"""
from __future__ import annotations

from typing import Any, Union

import tensorflow as tf

from tpu_pipeline.config import Config
from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.pipeline.builder import Pipeline

_RAGGED = ("data.outputs.inputs: its examples vary in length (a ragged feature), and a model needs static shapes: "
           "add data.sequence: {keys: [...], length: 1024, mode: pack} (or pad, bucket) to pad, bucket or pack them")


def element_shape(pipeline: Pipeline, task: str = "classification") -> Union[list[int], dict[str, list[int]]]:
    """The model's input shape(s) per example: one list, or a dict by input name (token ids with their
    segment ids and positions); refuses what a model cannot take, in one line naming data.outputs."""
    spec = pipeline.build().element_spec
    if not isinstance(spec, tuple):
        if predicts_tokens(task):
            raise ConfigError("data.outputs: a language model trains on (inputs, targets) token pairs: add {op: lm_shift, "
                              "key: tokens} to data.preprocess and set data.sequence.keys: [inputs, targets] (the "
                              "outputs follow from them), or set data.outputs {inputs: ..., targets: ..., weights: ...}")
        raise ConfigError("data.outputs: training needs (inputs, targets); set data.outputs {inputs: ..., targets: ...}")
    if predicts_tokens(task):
        _check_language_model_outputs(spec, pipeline)
    inputs = spec[0]
    named = inputs if isinstance(inputs, dict) else {"": inputs}
    shapes = {}
    for name, leaf in named.items():
        if isinstance(leaf, tf.RaggedTensorSpec):
            raise ConfigError(_RAGGED)
        if not isinstance(leaf, tf.TensorSpec):
            raise ConfigError(f"data.outputs.inputs: {name or 'the input'} is a {type(leaf).__name__}; a model takes tensors")
        shape = leaf.shape.as_list()[1:]
        mode = pipeline.sequence_mode
        bucket_length = mode is not None and mode.length_varies and len(shape) == 1
        if any(size is None for size in shape) and not bucket_length:  # a bucket's length: one compile per bucket
            raise ConfigError(
                f"data.outputs.inputs: its examples have shape {shape}, which varies (None); a model needs one fixed "
                "size: set data.image_size: [height, width] for a converted image folder, or add "
                "{op: resize, key: image, size: [height, width]} to data.preprocess"
            )
        shapes[name] = shape
    return shapes if isinstance(inputs, dict) else shapes[""]


def check_eval_feeds_the_model(config: Config, trained: Union[list[int], dict[str, list[int]]], spec: Any) -> None:
    """Refuses, before the first step, an evaluation whose inputs the model built for `data` cannot take
    (other input names, or another fixed length), in one line naming the keys that differ. `spec`: the
    element_spec of an evaluation dataset as built (`Pipeline.distribute(check=...)` hands it over)."""
    if not isinstance(spec, tuple):
        return  # no targets: for_evaluation says so
    inputs = spec[0] if isinstance(spec[0], dict) else {"": spec[0]}
    given = {name: leaf.shape.as_list()[1:] for name, leaf in inputs.items() if getattr(leaf, "shape", None) is not None}
    wanted = trained if isinstance(trained, dict) else {"": trained}
    data_sequence, eval_sequence = config.data.sequence, config.eval_data.sequence
    if set(given) != set(wanted):
        raise ConfigError(
            f"eval_data.outputs.inputs: evaluation gives the inputs {sorted(given)}, and the model trained on data takes "
            f"{sorted(wanted)}; leave eval_data.outputs and eval_data.sequence.mode out (they follow data's) or make "
            "them the same as data's"
        )
    for name, shape in wanted.items():
        if len(given[name]) == len(shape) and all(w is None or g == w for g, w in zip(given[name], shape)):
            continue
        where = f"its input {name!r}" if name else "its input"
        if data_sequence is not None and eval_sequence is not None and data_sequence.lengths() != eval_sequence.lengths():
            raise ConfigError(
                f"eval_data.sequence.length={eval_sequence.length}: the model trained on data.sequence.length="
                f"{data_sequence.length} takes {where} of shape {shape}, not {given[name]}; remove "
                "eval_data.sequence.length (it follows data.sequence.length) or make the two equal"
            )
        raise ConfigError(
            f"eval_data: {where} has shape {given[name]} per example, and the model trained on data takes {shape}; "
            "make eval_data's preprocessing give the same shape as data's"
        )


def _check_language_model_outputs(spec: tuple, pipeline: Pipeline) -> None:
    """A language model needs a target token per input position and weights that leave padding out."""
    targets = spec[1]
    if isinstance(targets, tf.RaggedTensorSpec):
        raise ConfigError(_RAGGED)
    if not isinstance(targets, tf.TensorSpec) or targets.shape.rank != 2 or not targets.dtype.is_integer:
        raise ConfigError(
            f"data.outputs.targets: train.task=language_model predicts a token id per position, so the targets must be "
            f"[batch, length] integer ids, not {targets}; shift the tokens with {{op: lm_shift, key: tokens}} and set "
            "data.outputs.targets: targets"
        )
    if len(spec) < 3 and pipeline.sequence_mode is not None:
        weights = pipeline.sequence_mode.weights_key
        raise ConfigError(
            f"data.outputs.weights: padded token rows need per-token weights, or the loss and metrics count the "
            f"padding; set data.outputs.weights: {weights}"
        )

"""Is a dataset fit for a TPU? Fully static shapes and dtypes XLA on TPU takes, checked up front.

A TPU compiles one program per input shape: a dynamic dimension (often a last partial batch)
fails or recompiles deep inside `fit`. Strings cannot be fed at all, and int64/float64 are not
native. We name each offending feature, its spec and the fix before training starts.

A bucketed pipeline (data.sequence mode: bucket) is the one planned exception: its batches have one
shape per bucket (one XLA compile each), so the spec it shows tf.data has `None` where the bucket
length (and, with bucket_batch: tokens, the batch) varies. The caller says which keys are bucketed
(`allow_dynamic`); nothing else may vary.

Beyond what a TPU cannot take at all, `tpu_advice` says what it takes slowly (warnings, not
errors): the Cloud TPU performance guide's tiling pads a tensor's last dimension to a multiple of
128 and the one before to a multiple of 8, so a token length that is not a multiple of 128 and a
per-replica batch that is not a multiple of 8 compute on padding. Each line names the config key
(`data.sequence.length`, `data.sequence.boundaries`, `data.batch_size`) and the nearest good values.
"""
from __future__ import annotations

from typing import Any, Collection, Iterator, Mapping, Optional, Sequence

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import TpuCompatibilityError
from tpu_pipeline.pipeline.sequences.token_count import sequence_keys

TPU_DTYPES = frozenset({tf.float32, tf.bfloat16, tf.int32, tf.uint32, tf.bool, tf.int8, tf.uint8, tf.complex64})

_DTYPE_FIX = {
    tf.string: "strings cannot go to a TPU: decode them (e.g. op decode_image) or drop them (op keep)",
    tf.int64: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
    tf.float64: "cast it to float32 or bfloat16 (op: {op: cast, key: NAME, dtype: float32})",
    tf.float16: "TPUs compute in bfloat16: cast it with {op: cast, key: NAME, dtype: bfloat16}",
    tf.uint16: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
    tf.int16: "cast it to int32 (op: {op: cast, key: NAME, dtype: int32})",
}


SEQUENCE_FIX = "give the token sequence a static length: data.sequence: {keys: [NAME], length: N, mode: pad|bucket|pack}"


def _walk(spec: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(spec, dict):
        for key in sorted(spec):
            yield from _walk(spec[key], f"{path}.{key}" if path else str(key))
    elif isinstance(spec, (tuple, list)):
        names = ("inputs", "targets", "sample_weights") if not path and len(spec) <= 3 else None
        for index, item in enumerate(spec):
            yield from _walk(item, names[index] if names else f"{path}[{index}]")
    else:
        yield path or "<element>", spec


def _dynamic_allowed(short: str, allow_dynamic: Collection[str]) -> set[int]:
    """Dimensions of a feature that may vary in a bucketed pipeline: a bucketed key and its mask, the
    bucket length (1) and the batch (0); every other feature, the batch (bucket_batch: tokens)."""
    if not allow_dynamic:
        return set()
    base = short[: -len("_mask")] if short.endswith("_mask") else short
    return {0, 1} if base in allow_dynamic else {0}


def tpu_problems(element_spec: Any, feature_names: Optional[Mapping[str, str]] = None,
                 allow_dynamic: Collection[str] = ()) -> list[str]:
    """One readable line per feature a TPU cannot take; empty when the dataset is fit.

    `feature_names`: the feature behind each position of an (inputs, targets) element, e.g.
    {"targets": "label"}, so that a suggested op names a key that exists. `allow_dynamic`: the
    keys of a bucketed pipeline (data.sequence mode: bucket), whose length and batch may vary by
    bucket (one compile per bucket); the other features' batch may vary with them."""
    problems = []
    for name, spec in _walk(element_spec, ""):
        short = (feature_names or {}).get(name) or name.split(".")[-1].split("[")[0]
        tokens = (isinstance(spec, (tf.TensorSpec, tf.SparseTensorSpec, tf.RaggedTensorSpec))
                  and spec.dtype.is_integer and spec.shape.rank == 2)  # [batch, length]: a token sequence
        if isinstance(spec, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            fix = (SEQUENCE_FIX.replace("NAME", short) if tokens else
                   "densify and pad it to a fixed length (FixedLenFeature, or pad in a preprocessing op)")
            problems.append(f"feature '{name}' is {type(spec).__name__} {spec}: TPUs need dense tensors; {fix}")
            continue
        if not isinstance(spec, tf.TensorSpec):
            problems.append(f"feature '{name}' has spec {spec!r}, which is not a dense tensor")
            continue
        if not spec.shape.is_fully_defined():
            dims = [i for i, d in enumerate(spec.shape.as_list() if spec.shape.rank is not None else [None]) if d is None]
            if spec.shape.rank is not None:
                dims = [i for i in dims if i not in _dynamic_allowed(short, allow_dynamic)]
            fix = (
                "batch with drop_remainder=true (data.drop_remainder) so every batch has the same size"
                if dims == [0]
                else SEQUENCE_FIX.replace("NAME", short) if tokens and dims == [1]
                else "give it a fixed size (e.g. op resize / center_crop for images, or a fixed-length feature)"
            )
            if dims:
                problems.append(f"feature '{name}' has dynamic shape {spec.shape} (dtype {spec.dtype.name}): {fix}")
        if spec.dtype not in TPU_DTYPES:
            fix = _DTYPE_FIX.get(spec.dtype, "cast it to float32, bfloat16 or int32").replace("NAME", short)
            problems.append(f"feature '{name}' has dtype {spec.dtype.name} (shape {spec.shape}): {fix}")
    return problems


BATCH_TILE = 8  # a TPU tiles a tensor's second-to-last dimension by 8 ...
LENGTH_TILE = 128  # ... and its last by 128 (Cloud TPU performance guide)


def _nearest(value: int, tile: int) -> list[int]:
    """The multiples of `tile` either side of `value` (the lower one only when positive)."""
    lower = value // tile * tile
    return [v for v in (lower, lower + tile) if v > 0]


def _per_replica_batch(element_spec: Any) -> Optional[int]:
    for _, spec in _walk(element_spec, ""):
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank and spec.shape[0] is not None:
            return int(spec.shape[0])
    return None


def _sequence_lengths(element_spec: Any) -> dict[str, int]:
    """{key: static length} of the token keys of a spec (`<key>_mask` or `<key>_segment_ids` beside them)."""
    leaves = {}
    for name, spec in _walk(element_spec, ""):
        leaves.setdefault(name.split(".")[-1], spec)
    lengths = {}
    for key in sequence_keys(element_spec):
        spec = leaves.get(key.name, leaves.get(key.marker))
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank == 2 and spec.shape[1] is not None:
            lengths[key.name] = int(spec.shape[1])
    return lengths


def tpu_advice(element_spec: Any, sequence_lengths: Optional[Mapping[str, int]] = None,
               bucket_lengths: Sequence[int] = (), replicas: int = 1, prefix: str = "data") -> list[str]:
    """What a TPU takes, but slowly: one line per token length that is not a multiple of 128 and for a
    per-replica batch that is not a multiple of 8, naming the config key and the nearest good values.

    `sequence_lengths`: data.sequence's {key: length} (default: found in the spec, from the keys with
    a `<key>_mask` or `<key>_segment_ids`); `bucket_lengths`: bucket mode's lengths, shortest first;
    `replicas`: the replicas sharing data.batch_size (the spec's batch is one replica's)."""
    advice = []
    batch = _per_replica_batch(element_spec)
    if batch is not None and batch % BATCH_TILE:
        good = " or ".join(f"{prefix}.batch_size={v * replicas}" for v in _nearest(batch, BATCH_TILE))
        per = f"{batch} per replica ({replicas} replicas)" if replicas > 1 else f"{batch} per replica"
        upper = _nearest(batch, BATCH_TILE)[-1]
        advice.append(f"{prefix}.batch_size={batch * replicas} gives batches of {per}; a TPU tiles the batch "
                      f"dimension by {BATCH_TILE}, so {upper - batch} of every {upper} rows compute on padding: "
                      f"use {good}")
    lengths = dict(sequence_lengths) if sequence_lengths is not None else _sequence_lengths(element_spec)
    one_length = len(set(lengths.values())) == 1
    for key, length in sorted(lengths.items())[:1] if one_length else sorted(lengths.items()):
        if length % LENGTH_TILE == 0:
            continue
        name = f"{prefix}.sequence.length" if one_length else f"{prefix}.sequence.length.{key}"
        upper = _nearest(length, LENGTH_TILE)[-1]
        good = " or ".join(str(v) for v in _nearest(length, LENGTH_TILE))
        advice.append(f"{name}={length}: a TPU tiles the last dimension by {LENGTH_TILE}, so a row of {length} "
                      f"tokens computes on {upper} ({(upper - length) / upper:.0%} padding): use {good}")
    short = [b for b in list(bucket_lengths)[:-1] if b % LENGTH_TILE]
    if short:
        advice.append(f"{prefix}.sequence.boundaries: buckets of {', '.join(map(str, short))} tokens are not multiples "
                      f"of {LENGTH_TILE}: a TPU computes each on the next multiple, so such a bucket costs a compile and "
                      f"saves little padding; use multiples of {LENGTH_TILE} (e.g. [128, 256, 512, ...]), none below "
                      f"{LENGTH_TILE}")
    return advice


def check_tpu_compatible(dataset_or_spec: Any, feature_names: Optional[Mapping[str, str]] = None,
                         allow_dynamic: Collection[str] = (), *, sequence_lengths: Optional[Mapping[str, int]] = None,
                         bucket_lengths: Sequence[int] = (), replicas: int = 1, prefix: str = "data") -> list[str]:
    """Raises TpuCompatibilityError naming every feature a TPU cannot take (call it on CPU too);
    otherwise logs (absl warning) and returns `tpu_advice`'s lines: what would run faster.

    `allow_dynamic`: the keys of a bucketed pipeline (see `tpu_problems`); the keyword arguments
    are `tpu_advice`'s."""
    spec = dataset_or_spec.element_spec if isinstance(dataset_or_spec, tf.data.Dataset) else dataset_or_spec
    problems = tpu_problems(spec, feature_names, allow_dynamic)
    if problems:
        raise TpuCompatibilityError("dataset is not fit for a TPU:\n  " + "\n  ".join(problems))
    advice = tpu_advice(spec, sequence_lengths, bucket_lengths, replicas, prefix)
    for line in advice:
        logging.warning("TPU advice: %s", line)
    return advice

"""Built-in ops on token sequences: truncate, lm_shift, append, prepend, tokenize_bytes.

Each reads one example's 1-D tensor (a `kind: ragged` feature as parsed, a `kind: sequence` feature
list of scalars, or another op's output) or a whole batch of them as a `[B, None]` RaggedTensor
(ragged_rank 1), and writes the same kind, with TensorFlow ops only, inside the pipeline's map.
Token id 0 is a real token: no op here looks at a value to find padding or a length (seqio's packer
counts non-zero tokens and so cannot hold id 0; MaxText pads with -1 for that reason). Padding,
bucketing and packing to a static length come after these ops (`data.sequence`).

Order matters and is the config's: truncate to `length - 1`, then append EOS, so the EOS survives;
`lm_shift` before packing (as MaxText does), so no target crosses from one packed example to the next.

These ops are batchable: on a batch parsed as a whole (`tf.io.parse_example` with a RaggedFeature, or
`parse_sequence_example`, gives `[B, None]` RaggedTensors) each row comes out as that example alone
would, so a pipeline can batch W serialized records, parse them with one call, run the ops on the
ragged batch and pack it as one window (tf.data's cost is per element: benchmarks/bench_packing.py). A dense
rank-2 tensor is refused: a `[B, L]` batch (padded: 0s that look like tokens) cannot be told apart
from one example's `[T, d]` feature list, so an op that cut "the last axis" could cut the wrong one
silently. `tokenize_bytes` maps each string to a row: one string gives a 1-D tensor, a `[B]` vector of
them (a batch) a `[B, None]` RaggedTensor (so would a per-example `shape: [k]` string feature: k rows).

Argument values are checked when the factory runs (pipeline build): a bad one is a one-line
ConfigError naming `data.preprocess[i]`, the op and the argument. What the feature is (its rank and
dtype) is checked when the map is traced, from the static shape, also before anything runs.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf

from tpu_pipeline.config.data import LOSS_WEIGHTS, WEIGHTED_TOKENS, weighted_key
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.ops import weighted_values
from tpu_pipeline.ops._util import feature, one_line
from tpu_pipeline.ops.registry import register_op

BYTE_OFFSET = 3  # tokenize_bytes: ids 0, 1, 2 stay free for padding, EOS and UNK/BOS (ByT5's layout: 259 ids)
_KEEP = ("head", "tail")


_refused = one_line  # a ConfigError raised while the map is traced, kept one line
_TAKES = "a sequence op takes one example's 1-D ids or a ragged batch [B, None]"


def _int(value: Any, op: str, arg: str, minimum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        need = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(f"op '{op}': {arg} must be {need}, got {value!r}")
    return value


def _name(value: Any, op: str, arg: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"op '{op}': {arg} must be a feature name (a non-empty string), got {value!r}")
    return value


def _batch(value: Any) -> bool:
    """Whether a sequence op's input is a ragged batch `[B, None]` (else one example's 1-D tensor)."""
    return isinstance(value, tf.RaggedTensor)


def _sequence(features: dict[str, Any], key: str, op: str, integer: bool = False) -> Any:
    """features[key]: one example's 1-D tensor or a `[B, None]` RaggedTensor (ragged_rank 1), refused
    (ConfigError, at trace time) when its static shape or dtype says it is neither (or, with `integer`,
    not integer ids)."""
    value = feature(features, key, op)
    what = f"op '{op}': feature '{key}'"
    if isinstance(value, tf.SparseTensor):
        raise _refused(f"{what} is a SparseTensor: {_TAKES}; give the feature kind: ragged")
    rank = value.shape.rank
    if _batch(value):
        if rank != 2 or value.ragged_rank != 1:
            raise _refused(f"{what} is a RaggedTensor of shape {value.shape} (ragged_rank {value.ragged_rank}), "
                           f"not a batch of 1-D sequences: {_TAKES}; give it one scalar id per step")
    elif rank is not None and rank != 1:
        if rank == 2:
            fix = ("a dense [B, L] batch cannot be told from one example's [T, d] feature list; give the feature "
                   "kind: ragged (or a scalar per step for kind: sequence)")
        elif value.dtype == tf.string and rank == 0:
            fix = "use tokenize_bytes for text"
        else:
            fix = "give the feature kind: ragged (or a scalar per step for kind: sequence)"
        raise _refused(f"{what} has shape {value.shape} ({value.dtype.name}), not a 1-D sequence: {_TAKES}; {fix}")
    if integer and not value.dtype.is_integer:
        raise _refused(f"{what} is {value.dtype.name}, not integer token ids; tokenize it first "
                       "(e.g. op tokenize_bytes), or set the op's key")
    return value


def _writes(op: str, key: str, out_key: Optional[str], fn: Callable[[Any], Any], integer: bool = False) -> Callable:
    """The op: features[out_key or key] = fn(features[key]), key checked to be a 1-D sequence or a ragged
    batch of them (fn takes either)."""
    _name(key, op, "key")
    target = key if out_key is None else _name(out_key, op, "out_key")

    def apply(features, seed=None):
        return {**features, target: fn(_sequence(features, key, op, integer))}

    return apply


@register_op("truncate", batchable=True)
def truncate(max_length: int, keep: str = "head", key: str = "tokens", out_key: Optional[str] = None):
    """At most `max_length` tokens: the first ones (keep: head) or the last ones (keep: tail).
    Shorter sequences, the empty one included, are left as they are (on a ragged batch, each row)."""
    length = _int(max_length, "truncate", "max_length", minimum=1)
    if keep not in _KEEP:
        raise ConfigError(f"op 'truncate': keep must be head or tail, got {keep!r}")
    # [-n:] of a shorter one is all of it; on a ragged batch, [:, -n:] cuts each row the same way.
    cut = slice(None, length) if keep == "head" else slice(-length, None)
    return _writes("truncate", key, out_key, lambda tokens: tokens[:, cut] if _batch(tokens) else tokens[cut])


def _shift_batch(tokens: tf.RaggedTensor, weights: Optional[tf.RaggedTensor] = None) -> tuple[Any, ...]:
    """`tokens[:, :-1]`, `tokens[:, 1:]` of a ragged batch, and `weights[:, 1:]` where given (one weight per token:
    checked by the caller), cut by the tokens' own indices. A batch of one document (what pack mode parses at a
    time when documents are tens of MB) is cut by slicing its values, not by indexing, which builds an int64 index
    as long as the document and two gathered copies."""
    def one() -> tuple[tf.Tensor, ...]:
        values = tokens.flat_values
        size = tf.size(values, tokens.row_splits.dtype)
        pairs = tf.maximum(size - 1, 0)
        cut = (values[:pairs], values[size - pairs:], tf.reshape(pairs, [1]))
        return cut + ((weights.flat_values[size - pairs:],) if weights is not None else ())

    def many() -> tuple[tf.Tensor, ...]:
        # Each row loses its last token from the inputs and its first from the targets: a partition by a mask
        # that is 0 at those tokens keeps the rest in order, at about half the CPU of a gather by an index per
        # token (benchmarks/README.md, "lm_shift by partition").
        starts, limits = tokens.row_splits[:-1], tokens.row_splits[1:]
        filled = limits > starts  # an empty row loses nothing (and has no first or last token)
        size = tf.size(tokens.flat_values, out_type=tokens.row_splits.dtype)

        def kept(at: tf.Tensor) -> tf.Tensor:  # int32 [size]: 1 on every token but those `at`
            drop = tf.boolean_mask(at, filled)[:, None]
            return tf.tensor_scatter_nd_update(tf.ones([size], tf.int32), drop, tf.zeros_like(drop[:, 0], tf.int32))

        as_input, as_target = kept(limits - 1), kept(starts)
        take = lambda values, mask: tf.dynamic_partition(values, mask, 2)[1]  # noqa: E731 (in order)
        values = tokens.flat_values
        cut = (take(values, as_input), take(values, as_target), tf.maximum(limits - starts - 1, 0))
        return cut + ((take(weights.flat_values, as_target),) if weights is not None else ())

    inputs, targets, lengths, *weighed = tf.cond(tf.equal(tokens.nrows(), 1), one, many)
    # Unvalidated: every row's length and its values were cut together above (weights: after the caller's check),
    # and validating (~40 ops a tensor) tripled this op in every build and ran on every block.
    ragged = lambda values: tf.RaggedTensor.from_row_lengths(values, lengths, validate=False)  # noqa: E731
    return (ragged(inputs), ragged(targets)) + tuple(ragged(w) for w in weighed)


def _same_lengths(tokens: Any, weights: Any, key: str, weights_key: str) -> tf.Operation:
    """Refuses, when the element runs, weights that are not one per token (a mask off by one trains on the wrong
    tokens), naming both features."""
    lengths = (tokens.row_lengths(), weights.row_lengths()) if _batch(tokens) else (tf.size(tokens), tf.size(weights))
    return tf.debugging.assert_equal(
        lengths[0], lengths[1], message=f"op 'lm_shift': feature '{weights_key}' must hold one weight per token of "
        f"'{key}' (a different number here); write them together, one per token")


def _on_values(fn: Callable, *tensors: Any) -> Any:
    """`fn` on the values of one example's tensors, or of ragged batches cut alike (the first one's row splits)."""
    if _batch(tensors[0]):
        return tensors[0].with_flat_values(fn(*(t.flat_values for t in tensors)))
    return fn(*tensors)


@register_op("lm_shift", batchable=True)
def lm_shift(key: str = "tokens", inputs_key: str = "inputs", targets_key: str = "targets", keep: bool = False,
             weights_key: str = LOSS_WEIGHTS, default_weight: Optional[int] = None):
    """Next-token pairs: `inputs = tokens[:-1]`, `targets = tokens[1:]` (n tokens give n - 1 pairs; 0 or 1 token,
    none). `key` is removed unless `keep: true`. Shift before packing, so no target crosses examples.
    On a ragged batch: `tokens[:, :-1]`, `tokens[:, 1:]` (an empty row gives two empty rows).

    Loss weights (1 on the tokens to learn, such as an assistant's answer, 0 elsewhere) become each target's
    weight, `weights[1:]`, so a token is trained on where it is predicted. They come three ways, and each target
    then leaves with its weight inside it, as `weighted_<targets_key>` (`2 * id + weight`, ops/weighted_values.py;
    data.sequence takes them apart in the rows as `<targets_key>` and `loss_weights`):
    - `key: weighted_tokens`, what `convert --from chat` writes: each token already `2 * id + weight`;
    - a feature `weights_key` (`loss_weights`) beside the tokens, one per token (another count is refused when
      it runs);
    - `default_weight` (0 or 1) for examples without either: a plain-text source mixed with instruction data
      trains on all its tokens with `default_weight: 1`."""
    op = "lm_shift"
    key = _name(key, op, "key")
    inputs_key, targets_key = _name(inputs_key, op, "inputs_key"), _name(targets_key, op, "targets_key")
    weights_key = _name(weights_key, op, "weights_key")
    folded_in = key == WEIGHTED_TOKENS
    carried = weighted_key(targets_key)
    if inputs_key == targets_key:
        raise ConfigError(f"op 'lm_shift': inputs_key and targets_key are both {inputs_key!r}; give two names")
    if weights_key in (key, inputs_key, targets_key):
        raise ConfigError(f"op 'lm_shift': weights_key {weights_key!r} is also the name of the tokens or of an "
                          "output; give the weights a name of their own")
    if not isinstance(keep, bool):
        raise ConfigError(f"op 'lm_shift': keep must be true or false (keep the feature {key!r}), got {keep!r}")
    if default_weight is not None and (isinstance(default_weight, bool) or default_weight not in (0, 1)
                                       or not isinstance(default_weight, int)):
        raise ConfigError(f"op 'lm_shift': default_weight must be 0 or 1 (the {weights_key} of examples without "
                          f"them), got {default_weight!r}")
    if default_weight is not None and folded_in:
        raise ConfigError(f"op 'lm_shift': key {key!r} holds its weights already (each token 2 * id + weight); "
                          "drop default_weight")
    if keep and key in (inputs_key, targets_key, carried):
        raise ConfigError(f"op 'lm_shift': keep: true keeps {key!r}, which is also an output name; "
                          "set keep: false or other inputs_key/targets_key")

    def apply(features, seed=None):
        tokens = _sequence(features, key, op)
        clash = sorted(k for k in (inputs_key, targets_key, carried) if k in features and k != key)
        if clash:
            raise _refused(f"op 'lm_shift': feature(s) {clash} exist already and would be overwritten; set "
                           "inputs_key/targets_key to other names (or drop them with op keep)")
        out = {k: v for k, v in features.items() if (keep or k != key) and k != weights_key}
        weights = _sequence(features, weights_key, op) if weights_key in features else None
        if weights is not None and folded_in:
            raise _refused(f"op 'lm_shift': feature {key!r} holds its weights already (each token 2 * id + weight) "
                           f"and {weights_key!r} gives them again; read one of the two")
        if weights is not None:  # each target's weight is its token's: cut by the tokens' own indices
            with tf.control_dependencies([_same_lengths(tokens, weights, key, weights_key)]):
                if _batch(tokens):
                    inputs, targets, weights = _shift_batch(tokens, weights)
                else:
                    inputs, targets, weights = tokens[:-1], tokens[1:], weights[1:]
            fold = lambda t, w: weighted_values.fold(t, w, weights_key, targets_key, "op 'lm_shift': ")  # noqa: E731
            out[inputs_key], out[carried] = inputs, _on_values(fold, targets, weights)
            return out
        inputs, targets = _shift_batch(tokens) if _batch(tokens) else (tokens[:-1], tokens[1:])
        if folded_in:  # the inputs are ids; each target keeps its weight inside it
            out[inputs_key], out[carried] = _on_values(weighted_values.ids_of, inputs), targets
        elif default_weight is not None:  # every target weighs default_weight
            out[inputs_key] = inputs
            out[carried] = _on_values(lambda t: t * 2 + default_weight, targets)
        else:
            out[inputs_key], out[targets_key] = inputs, targets
        return out

    return apply


def _edge(op: str, id: int, key: str, out_key: Optional[str], at_end: bool) -> Callable:
    token = _int(id, op, "id")

    def fn(tokens: Any) -> Any:
        limits = tokens.dtype.min, tokens.dtype.max
        if not limits[0] <= token <= limits[1]:
            raise _refused(f"op '{op}': id {token} does not fit the feature '{key}' ({tokens.dtype.name}); "
                           f"give an id in {limits[0]}..{limits[1]}")
        if _batch(tokens):  # a [B, 1] column of the id, concatenated to each row (faster than a stitch or scatter)
            column = tf.fill(tf.stack([tokens.nrows(), 1]), tf.constant(token, tokens.dtype))
            edge = tf.RaggedTensor.from_tensor(column, row_splits_dtype=tokens.row_splits.dtype)
            return tf.concat([tokens, edge] if at_end else [edge, tokens], axis=1)
        edge = tf.constant([token], dtype=tokens.dtype)
        return tf.concat([tokens, edge] if at_end else [edge, tokens], axis=0)

    return _writes(op, key, out_key, fn, integer=True)


@register_op("append", batchable=True)
def append(id: int, key: str = "tokens", out_key: Optional[str] = None):
    """Adds token `id` at the end (an EOS); an empty sequence becomes [id] (on a ragged batch, each row)."""
    return _edge("append", id, key, out_key, at_end=True)


@register_op("prepend", batchable=True)
def prepend(id: int, key: str = "tokens", out_key: Optional[str] = None):
    """Adds token `id` at the start (a BOS); an empty sequence becomes [id] (on a ragged batch, each row)."""
    return _edge("prepend", id, key, out_key, at_end=False)


@register_op("tokenize_bytes", batchable=True)
def tokenize_bytes(offset: int = BYTE_OFFSET, key: str = "text", out_key: Optional[str] = None):
    """A string's UTF-8 bytes as int32 ids `byte + offset` (a byte-level vocabulary of 256 + offset ids, no
    dependency). The default offset 3 keeps ids 0, 1, 2 free for padding, EOS and one more special id (UNK
    or BOS): ByT5's layout, so a pad value of 0 never collides with a byte.

    One string (shape []) gives a 1-D tensor; a `[B]` vector of strings (a batch parsed as a whole) gives a
    `[B, None]` RaggedTensor, row i the bytes of string i (the empty string an empty row).

    `tf.io.decode_raw` reads the bytes in one op: on a 2 KB string it added ~1 us per element to an
    identity map (2-core CPU, TF 2.21), where `tf.strings.bytes_split` followed by a decode or a lookup
    table added ~85 us. A batch is joined into one string (`tf.strings.reduce_join`), decoded with one
    `decode_raw` and cut into rows by `tf.strings.length`: on 64 strings of ~2 KB (126 KB) that took
    ~0.4-0.5 ms per batch (~7 us per string), against ~1.2-1.5 ms for `decode_raw(fixed_length=longest)`
    then `RaggedTensor.from_tensor(lengths=...)`, ~1.3-1.9 ms for a `map_fn` of `decode_raw`, ~4-6 ms for
    `bytes_split` then `decode_raw` of the 1-byte strings, ~45-60 ms for one `substr` per byte (best of 5
    runs in a tf.function; 2-core CPU, shared, TF 2.21). `tf.strings.unicode_decode` gives code points,
    not bytes.
    """
    op = "tokenize_bytes"
    shift = _int(offset, op, "offset", minimum=0)
    if shift > (1 << 31) - 256:
        raise ConfigError(f"op 'tokenize_bytes': offset {shift} pushes byte ids past int32; use a smaller one")
    _name(key, op, "key")
    target = key if out_key is None else _name(out_key, op, "out_key")

    def apply(features, seed=None):
        text = feature(features, key, op)
        composite = isinstance(text, (tf.RaggedTensor, tf.SparseTensor))
        if composite or text.dtype != tf.string or text.shape.rank not in (0, 1, None):
            raise _refused(f"op 'tokenize_bytes': feature '{key}' is {text.dtype.name} with shape {text.shape}, not "
                           "one string per example (or a [B] batch of them); give it dtype: string and shape [] "
                           "(or set the op's key)")
        if text.shape.rank == 1:
            flat = tf.io.decode_raw(tf.strings.reduce_join(text), tf.uint8)  # [N]: every byte of the batch
            ids = tf.cast(flat, tf.int32) + shift
            lengths = tf.cast(tf.strings.length(text), tf.int64)  # in bytes (unit BYTE)
            return {**features, target: tf.RaggedTensor.from_row_lengths(ids, lengths, validate=False)}
        ids = tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32) + shift
        return {**features, target: tf.reshape(ids, [-1])}

    return apply

"""A pre-norm Transformer over token ids: a decoder-only language model or an encoder classifier.

Built from maintained Keras layers (Embedding, MultiHeadAttention, LayerNormalization, Dense,
Dropout) for tf_keras or Keras 3, whichever module is passed in; the few layers of its own are
written over `keras.ops` under Keras 3 (one code for its TensorFlow and JAX backends) and over the
same tf ops as ever under tf_keras (`tensor_ops`). The inputs are the batch's dict
(docs/sequences.md): `<tokens>` ids, and `<tokens>_segment_ids` / `<tokens>_positions` in pack
mode or `<tokens>_mask` in pad and bucket mode. Attention is masked per segment, so a packed row
computes exactly what its examples would alone, and no real token ever sees padding.

Under a mixed policy the body runs in bfloat16/float16, while the attention softmax, the pooling
and the logits run in float32 (the loss's softmax needs them so).
"""
from __future__ import annotations

import functools
import math
from types import ModuleType, SimpleNamespace
from typing import Any, Mapping, Optional, Union

import tensorflow as tf

from tpu_pipeline.config.model import ModelConfig, TransformerConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model.keras_backend import is_keras3
from tpu_pipeline.model.tasks import Task, task_named
from tpu_pipeline.model.tensor_ops import tensor_ops

SEGMENT_SUFFIX = "_segment_ids"
POSITION_SUFFIX = "_positions"
MASK_SUFFIX = "_mask"
_MASKED_SCORE = -1e9  # finite: a softmax over masked scores stays a number in float32
_INIT_STDDEV = 0.02  # GPT-2/BERT's embedding init (measured: as good as Keras's uniform ±0.05 here)


def find_tokens_key(tokens_key: Optional[str], names: list[str]) -> str:
    """The input holding token ids: `tokens_key`, or the one name that is not a segment/position/mask."""
    if tokens_key is not None:
        if tokens_key not in names:
            raise ConfigError(f"model.transformer.tokens_key={tokens_key!r} is not an input; the inputs are {names}")
        return tokens_key
    candidates = [n for n in names if not n.endswith((SEGMENT_SUFFIX, POSITION_SUFFIX, MASK_SUFFIX))]
    if len(candidates) != 1:
        raise ConfigError(f"model.transformer.tokens_key: cannot tell which input holds the token ids among {names}; "
                          f"set model.transformer.tokens_key to one of {candidates or names}")
    return candidates[0]


def is_causal(cfg: TransformerConfig, task: Task) -> bool:
    """config.causal, else the task's: causal for a language model and bidirectional for a classifier."""
    return cfg.causal if cfg.causal is not None else task.causal


def vocabulary_size(cfg: TransformerConfig, num_classes: int, task: Task) -> int:
    """Rows of the token embedding: vocab_size, else the output vocabulary of a task that predicts tokens."""
    if task.predicts_tokens:
        vocab = cfg.vocab_size or num_classes
        if cfg.tie_embeddings and vocab != num_classes:
            raise ConfigError(f"model.transformer.vocab_size={vocab} differs from the {num_classes} logits of the "
                              "language model (train.num_classes); tied embeddings need one vocabulary: make them "
                              "equal or set model.transformer.tie_embeddings: false")
        return vocab
    if cfg.vocab_size is None:
        raise ConfigError("model.transformer.vocab_size: a Transformer classifier needs the token vocabulary size; "
                          "set model.transformer.vocab_size (the tokenizer's vocabulary)")
    return cfg.vocab_size


def position_rows(cfg: TransformerConfig, length: Optional[int]) -> int:
    """Rows of the position embedding: max_length, else the inputs' static length."""
    if cfg.max_length is None:
        if length is None:
            raise ConfigError("model.transformer.max_length: the inputs' length varies (bucket mode), so the position "
                              "embedding needs a size; set model.transformer.max_length to the longest bucket")
        return length
    if length is not None and length > cfg.max_length:
        raise ConfigError(f"model.transformer.max_length={cfg.max_length} is shorter than the inputs' length {length}; "
                          "raise it or remove it (the inputs' length is the default)")
    return cfg.max_length


@functools.lru_cache(maxsize=None)
def _layers(keras: ModuleType) -> SimpleNamespace:
    """The small layers the Transformer needs besides Keras's own, subclassed from `keras`'s Layer.

    They hold no kernels: masks and positions from int inputs, the tied logits, pooling, and the
    attention softmax in float32. Defined per Keras module, since tf_keras and Keras 3 layers differ,
    and written once over `tensor_ops(keras)`.
    """
    ops = tensor_ops(keras)

    class AttentionMask(keras.layers.Layer):
        """[B, L] segment ids → [B, L, L] bool: query i may see key j.

        Same segment, real query (segment != 0), and j <= i when causal. A padding query sees itself
        only: a softmax over no keys at all would average the whole row (or be NaN in float16).
        """

        def __init__(self, causal: bool, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.causal = causal

        def call(self, segments: Any) -> Any:
            segments = ops.cast(segments, "int32")
            query, key = segments[:, :, None], segments[:, None, :]
            real = ops.not_equal(query, 0)
            allowed = ops.logical_and(ops.equal(query, key), real)
            index = ops.arange(ops.shape(segments)[1], dtype="int32")
            if self.causal:
                allowed = ops.logical_and(allowed, index[None, None, :] <= index[None, :, None])
            itself = ops.logical_and(ops.equal(index[None, None, :], index[None, :, None]), ops.logical_not(real))
            return ops.logical_or(allowed, itself)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "causal": self.causal}

    class RowPositions(keras.layers.Layer):
        """0..L-1 in every row: the positions of one example per row."""

        def call(self, tokens: Any) -> Any:
            shape = ops.shape(tokens)
            return ops.broadcast_to(ops.arange(shape[1], dtype="int32")[None, :], shape)

    class AllOnes(keras.layers.Layer):
        """Segment 1 everywhere: a row that is one example without padding."""

        def call(self, tokens: Any) -> Any:
            return ops.ones_like(tokens, dtype="int32")

    class TiedLogits(keras.layers.Layer):
        """logits = h @ E^T with the token embedding E, in float32: no second vocabulary matrix."""

        def __init__(self, embedding: Any, **kwargs: Any) -> None:
            super().__init__(dtype="float32", **kwargs)
            self.embedding = embedding

        def call(self, hidden: Any) -> Any:
            matrix = ops.cast(self.embedding.embeddings, "float32")
            return ops.einsum("blw,vw->blv", ops.cast(hidden, "float32"), matrix)

        def get_config(self) -> dict[str, Any]:
            # For the model's JSON summary (TensorBoard writes one): the shared layer by name. Whole-model
            # saving is not how runs persist (checkpoints of the weights are), so from_config is not offered.
            return {**super().get_config(), "embedding": self.embedding.name}

    class Pool(keras.layers.Layer):
        """[B, L, W] → [B, W] in float32: the mean over the row's real tokens, or its first token."""

        def __init__(self, mode: str, **kwargs: Any) -> None:
            super().__init__(dtype="float32", **kwargs)
            self.mode = mode

        def call(self, inputs: Any) -> Any:
            hidden, segments = inputs
            hidden = ops.cast(hidden, "float32")
            if self.mode == "first":
                return hidden[:, 0]
            weight = ops.cast(ops.not_equal(segments, 0), "float32")[:, :, None]
            return ops.sum(hidden * weight, axis=1) / ops.maximum(ops.sum(weight, axis=1), 1.0)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "mode": self.mode}

    parent_softmax = getattr(keras.layers.MultiHeadAttention, "_masked_softmax", None)
    if parent_softmax is None:  # pragma: no cover - both Kerases have it (tf_keras 2.21, Keras 3.15)
        raise ImportError(f"{keras.__name__}.layers.MultiHeadAttention has no _masked_softmax to keep in float32")

    class Attention(keras.layers.MultiHeadAttention):
        """MultiHeadAttention whose softmax runs in float32 with a finite mask value.

        Under mixed_bfloat16 a bfloat16 softmax keeps 8 bits of its probabilities; under float16
        Keras's additive mask can overflow to -inf. Keras 3 with attention_dropout 0 takes its fused
        `ops.dot_product_attention` instead (softmax in float32 there too, the [B, L, L] mask per row).
        Its flash path stays off: on a TPU, called outside jit, Keras hands the splash kernel one
        [L, L] mask for the whole batch (the first row's), so packed examples would see each other;
        inside jit Keras falls back to the same XLA attention anyway.
        """

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            if hasattr(self, "_flash_attention"):  # Keras 3: None means "wherever it can", even on TPU
                self._flash_attention = False

        def _masked_softmax(self, attention_scores: Any, attention_mask: Any = None) -> Any:
            dtype = attention_scores.dtype
            scores = ops.cast(attention_scores, "float32")
            if attention_mask is not None:
                mask = ops.cast(attention_mask, "bool")
                for _ in range(len(scores.shape) - len(mask.shape)):  # [B, T, S] → [B, 1, T, S] (heads)
                    mask = ops.expand_dims(mask, axis=-3)
                scores = ops.where(mask, scores, ops.cast(_MASKED_SCORE, "float32"))
            return ops.cast(ops.softmax(scores, axis=-1), dtype)

    return SimpleNamespace(AttentionMask=AttentionMask, RowPositions=RowPositions, AllOnes=AllOnes,
                           TiedLogits=TiedLogits, Pool=Pool, Attention=Attention)


def _segments(keras: ModuleType, inputs: Mapping[str, Any], tokens_key: str) -> Any:
    """`<tokens>_segment_ids`, else `<tokens>_mask` (1 real, 0 padding), else one segment per row."""
    for suffix in (SEGMENT_SUFFIX, MASK_SUFFIX):
        if tokens_key + suffix in inputs:
            return inputs[tokens_key + suffix]
    return _layers(keras).AllOnes(name="segment_ids")(inputs[tokens_key])


def _positions(keras: ModuleType, inputs: Mapping[str, Any], tokens_key: str) -> Any:
    """`<tokens>_positions` (restarting per packed example), else the index in the row."""
    if tokens_key + POSITION_SUFFIX in inputs:
        return inputs[tokens_key + POSITION_SUFFIX]
    return _layers(keras).RowPositions(name="positions")(inputs[tokens_key])


def _embedding(keras: ModuleType, rows: int, width: int, name: str) -> Any:
    initializer = keras.initializers.RandomNormal(stddev=_INIT_STDDEV)
    return keras.layers.Embedding(rows, width, embeddings_initializer=initializer, name=name)


def _attention_kernels(keras: ModuleType) -> Any:
    """The attention projections' initializer: the same on every Keras, tf_keras's own.

    Their kernels are 3-D ([width, heads, head_dim] and [heads, head_dim, width]). tf_keras's Glorot reads
    them as convolution kernels (fan_in = shape[0] * shape[1], fan_out = shape[0] * shape[2]: a standard
    deviation of 0.021 for text_lm's query, key and value), while Keras 3.15 tells its Glorot the true
    axes (0.088, four times larger). From each framework's own draw the two then trained apart: 1.857
    against 1.914 nats after text_lm's 600 steps on the new user's corpus (issue 47 item 1,
    benchmarks/README.md). The axes below give Keras 3 tf_keras's fans; a Keras 3 without them used those
    fans anyway."""
    if not is_keras3(keras):
        return "glorot_uniform"
    try:
        return keras.initializers.GlorotUniform(input_axes=[0, 1], output_axes=[0, 2])
    except TypeError:  # Keras 3 before input_axes: convolution fans already
        return "glorot_uniform"


def _norm(keras: ModuleType, name: str) -> Any:
    return keras.layers.LayerNormalization(epsilon=1e-6, name=name)


def _dropout(keras: ModuleType, rate: float, x: Any, name: str) -> Any:
    return keras.layers.Dropout(rate, name=name)(x) if rate else x


def _block(keras: ModuleType, cfg: TransformerConfig, x: Any, mask: Any, name: str) -> Any:
    """x + attention(norm(x)), then x + mlp(norm(x)): pre-norm keeps deep stacks trainable without warm-up tricks."""
    y = _norm(keras, f"{name}_attention_norm")(x)
    attention = _layers(keras).Attention(num_heads=cfg.heads, key_dim=cfg.width // cfg.heads,
                                         dropout=cfg.attention_dropout, kernel_initializer=_attention_kernels(keras),
                                         name=f"{name}_attention")
    y = attention(y, y, attention_mask=mask)
    y = _dropout(keras, cfg.dropout, y, f"{name}_attention_dropout")
    x = keras.layers.Add(name=f"{name}_attention_residual")([x, y])
    y = _norm(keras, f"{name}_mlp_norm")(x)
    y = keras.layers.Dense(cfg.mlp_dim or 4 * cfg.width, activation="gelu", name=f"{name}_mlp_in")(y)
    y = keras.layers.Dense(cfg.width, name=f"{name}_mlp_out")(y)
    y = _dropout(keras, cfg.dropout, y, f"{name}_mlp_dropout")
    return keras.layers.Add(name=f"{name}_mlp_residual")([x, y])


def build_transformer(keras: ModuleType, config: ModelConfig, inputs: Mapping[str, Any], num_classes: int,
                      task: Union[str, Task]) -> Any:
    """The logits of a Transformer over `inputs` (name → int32 KerasTensor [B, L]).

    language_model: [B, L, num_classes] (num_classes is the vocabulary), causal unless
    model.transformer.causal says otherwise. classification: [B, num_classes] from the pooled row.
    """
    task = task_named(task)
    cfg = config.transformer
    tokens_key = find_tokens_key(cfg.tokens_key, list(inputs))
    tokens = inputs[tokens_key]
    if len(tokens.shape) != 2:
        raise ConfigError(f"model.transformer: input {tokens_key!r} has shape {list(tokens.shape)[1:]} per example; "
                          "token ids are one [length] list per example (set model.transformer.tokens_key)")
    segments = _segments(keras, inputs, tokens_key)
    vocab = vocabulary_size(cfg, num_classes, task)
    token_embedding = _embedding(keras, vocab, cfg.width, "token_embedding")
    position_embedding = _embedding(keras, position_rows(cfg, tokens.shape[1]), cfg.width, "position_embedding")
    embedded = token_embedding(tokens)
    if task.predicts_tokens and cfg.tie_embeddings:
        # Gemma's scale: a tied matrix is sized for the logits (N(0, 0.02)), so its rows are tiny beside
        # the blocks' outputs; x sqrt(width) cut the tied model's loss gap to the untied one by ~half
        # (benchmarks/bench_lm_quality.py).
        embedded = keras.layers.Rescaling(math.sqrt(cfg.width), name="token_embedding_scale")(embedded)
    x = keras.layers.Add(name="embeddings")([embedded, position_embedding(_positions(keras, inputs, tokens_key))])
    x = _dropout(keras, cfg.dropout, x, "embedding_dropout")
    mask = _layers(keras).AttentionMask(is_causal(cfg, task), name="attention_mask")(segments)
    for i in range(cfg.depth):
        x = _block(keras, cfg, x, mask, f"block{i}")
    x = _norm(keras, "final_norm")(x)
    if not task.predicts_tokens:  # one row of logits per example
        pooled = _layers(keras).Pool(cfg.pooling, name="pool")([x, segments])
        return keras.layers.Dense(num_classes, dtype="float32", name="logits")(pooled)
    if cfg.tie_embeddings:
        return _layers(keras).TiedLogits(token_embedding, name="logits")(x)
    return keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)

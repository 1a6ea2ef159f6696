"""Does our default language model learn as well as a plain Keras one? Both trained side by side.

    .venv/bin/python benchmarks/bench_lm_quality.py [--config configs/text_lm.yaml] [--epochs 4 --steps_per_epoch 100]
        [--variant "tied:model.transformer.tie_embeddings=true"] [--seed 1] [--json out.json]

Text: the built-in text demo, every paragraph of the CPython documentation that ships with Python
(`pydoc_data.topics`), written byte-level by `tpu_pipeline.records.demo_text` into the directory
`configs/text_lm.yaml` names (any config's data/eval_data may point elsewhere).

Batches: `Pipeline.from_config` of the config's `data` section (packed rows, segment ids and
positions) is read once for all the training steps, and `eval_data` once for validation; every
model then trains on exactly those batches, in the same order, and is scored on exactly those
validation batches. So only the models differ.

Models, each with the optimizer and schedule of the config's `model` section (AdamW, cosine with
warm-up, clipnorm) over the same steps (`train.epochs` x `train.steps_per_epoch`, or the flags):
  ours       `tpu_pipeline.model.build_model` on the config, as `tpu-pipeline train` builds it
  reference  only tf_keras's own layers: Embedding (tokens, and positions from `inputs_positions`),
             pre-norm blocks of LayerNormalization → MultiHeadAttention (attention_mask = causal ∧
             same segment) → residual, LayerNormalization → Dense(mlp, gelu) → Dense(width) → residual,
             a final LayerNormalization and an untied Dense to the vocabulary; Keras's default
             initializers everywhere; Keras's own AdamW and CosineDecay (decoupled weight decay on
             every weight, as Keras does by default). The same width, depth, heads and MLP size.
  variants   ours with config overrides (`--variant NAME:key=value,key=value`), e.g. tied or not.

Validation loss is computed here, the same way for every model: the cross-entropy of every real
target (weight from `targets_segment_ids` > 0) in nats per token, and bits per byte (its sum in bits
over the number of targets that are bytes, EOS included in the bits, as `train` reports it).
`--seed` changes every model's initial weights (not the batches): the spread between seeds is in
benchmarks/README.md, next to the figures.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from tpu_pipeline import Pipeline, load_config  # noqa: E402
from tpu_pipeline.config.loader import apply_overrides, config_from_dict, read_layered  # noqa: E402
from tpu_pipeline.demo import ensure_builtin_data  # noqa: E402
from tpu_pipeline.model.builder import build_model  # noqa: E402
from tpu_pipeline.model.optimizers import ADAMW_DEFAULT_WEIGHT_DECAY, clip_summed_slices  # noqa: E402
from tpu_pipeline.model.schedules import schedule_steps  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENS, SEGMENTS, POSITIONS = "inputs", "inputs_segment_ids", "inputs_positions"


def load(config_path: str, overrides: Sequence[str]) -> Any:
    """The config as `tpu-pipeline train` reads it (the built-in demo text written first if named)."""
    raw = apply_overrides(read_layered([config_path]), list(overrides))
    ensure_builtin_data(raw)
    return config_from_dict(raw)


def read_batches(data: Any, count: int | None) -> list[tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]]:
    """`count` batches of the pipeline (all of them when None), as numpy: fed unchanged to every model."""
    dataset = Pipeline.from_config(data, target="cpu").build()
    if count is not None:
        dataset = dataset.take(count)
    batches = []
    for inputs, targets, weights in dataset.as_numpy_iterator():
        batches.append(({name: inputs[name] for name in (TOKENS, SEGMENTS, POSITIONS)}, targets, weights))
    if count is not None and len(batches) < count:
        raise SystemExit(f"the training data gave {len(batches)} batches, not {count}: set data.repeat: forever")
    return batches


def as_dataset(batches: list) -> tf.data.Dataset:
    """The batches in order, for `fit` (one pass = the whole run)."""
    stacked = tf.nest.map_structure(lambda *parts: np.stack(parts), *batches)
    return tf.data.Dataset.from_tensor_slices(stacked)


def reference_model(vocab: int, length: int, width: int, depth: int, heads: int, mlp: int) -> keras.Model:
    """A causal pre-norm Transformer from tf_keras's own layers and initializers; untied output."""
    inputs = {name: keras.Input([length], dtype="int32", name=name) for name in (TOKENS, SEGMENTS, POSITIONS)}
    segments = inputs[SEGMENTS]
    same = tf.equal(segments[:, :, None], segments[:, None, :])
    causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)[None]  # key j <= query i
    mask = tf.logical_and(same, causal)
    x = keras.layers.Embedding(vocab, width)(inputs[TOKENS]) + keras.layers.Embedding(length, width)(inputs[POSITIONS])
    for _ in range(depth):
        y = keras.layers.LayerNormalization()(x)
        y = keras.layers.MultiHeadAttention(heads, width // heads)(y, y, attention_mask=mask)
        x = x + y
        y = keras.layers.LayerNormalization()(x)
        y = keras.layers.Dense(mlp, activation="gelu")(y)
        x = x + keras.layers.Dense(width)(y)
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(x))
    return keras.Model(inputs, logits, name="reference")


def reference_optimizer(config: Any, steps_per_epoch: int, epochs: int) -> Any:
    """Keras's AdamW and CosineDecay with the config's numbers (warm-up, peak, clipnorm, weight decay)."""
    opt, sched = config.model.optimizer, config.model.schedule
    if opt.name != "adamw" or sched.name != "cosine":
        raise SystemExit("the reference mirrors model.optimizer.name=adamw and model.schedule.name=cosine only")
    warmup, total = schedule_steps(sched, steps_per_epoch, epochs)
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else sched.learning_rate, decay_steps=total - warmup, alpha=sched.final_fraction,
        warmup_target=sched.learning_rate if warmup else None, warmup_steps=warmup)
    decay = ADAMW_DEFAULT_WEIGHT_DECAY if opt.weight_decay is None else opt.weight_decay
    return keras.optimizers.AdamW(schedule, weight_decay=decay, beta_1=opt.beta_1, beta_2=opt.beta_2,
                                  epsilon=opt.epsilon, global_clipnorm=opt.global_clipnorm)


def evaluate(model: Any, batches: list, byte_offset: int | None) -> dict[str, float]:
    """Nats per real target token and bits per byte over every validation batch."""
    nats = tokens = byte_targets = 0.0

    @tf.function
    def losses(inputs: Any, targets: Any) -> Any:
        logits = tf.cast(model(inputs, training=False), tf.float32)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.cast(targets, tf.int32), logits=logits)

    for inputs, targets, weights in batches:
        per_token = losses(inputs, targets).numpy()
        real = np.asarray(weights, np.float64) > 0
        nats += float(per_token[real].sum())
        tokens += float(real.sum())
        if byte_offset is not None:
            byte_targets += float((real & (targets >= byte_offset)).sum())
    result = {"nats_per_token": nats / tokens, "tokens": tokens}
    if byte_offset is not None:
        result["bits_per_byte"] = nats / math.log(2.0) / byte_targets
    return result


def train(name: str, make: Callable[[], Any], train_set: tf.data.Dataset, steps: int, eval_batches: list,
          byte_offset: int | None, seed: int = 0) -> dict[str, Any]:
    keras.utils.set_random_seed(seed)  # the same seed for every model's initial weights
    model = make()
    start = time.perf_counter()
    history = model.fit(train_set, epochs=1, steps_per_epoch=steps, verbose=0)
    seconds = time.perf_counter() - start
    result = {"name": name, "parameters": int(model.count_params()), "train_seconds": round(seconds, 1),
              "final_train_loss": float(history.history["loss"][-1]), **evaluate(model, eval_batches, byte_offset)}
    print(f"  {name:<28} val {result['nats_per_token']:.4f} nats/token, "
          f"{result.get('bits_per_byte', float('nan')):.4f} bits/byte; {result['parameters']:,} parameters, "
          f"{seconds:.0f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "text_lm.yaml"))
    parser.add_argument("--epochs", type=int, default=None, help="default: the config's train.epochs")
    parser.add_argument("--steps_per_epoch", type=int, default=None, help="default: the config's train.steps_per_epoch")
    parser.add_argument("--override", action="append", default=[], help="key=value on the config, for every model")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:key=value,key=value — an extra 'ours' model with these overrides")
    parser.add_argument("--no_default", action="store_true", help="leave out 'ours' with the config as it is")
    parser.add_argument("--no_reference", action="store_true", help="leave out the Keras reference")
    parser.add_argument("--reference_dense_clip", action="store_true",
                        help="add the reference with its global_clipnorm reading embedding gradients' true norm "
                             "(tf_keras's own reads the unsummed rows: model/optimizers.py, clip_summed_slices)")
    parser.add_argument("--seed", type=int, default=0, help="initial weights' seed (the batches stay the same)")
    parser.add_argument("--json", default=None, help="write every result here")
    args = parser.parse_args()

    config = load(args.config, args.override)
    epochs = args.epochs or config.train.epochs
    steps_per_epoch = args.steps_per_epoch or config.train.steps_per_epoch
    steps = epochs * steps_per_epoch
    t = config.model.transformer
    print(f"data: {config.data.source.dir} (train) / {config.eval_data.source.dir} (validation); "
          f"{steps} steps ({epochs} x {steps_per_epoch}) of {config.data.batch_size} rows; model width {t.width}, "
          f"depth {t.depth}, heads {t.heads}, mlp {t.mlp_dim or 4 * t.width}; {config.model.optimizer.name} "
          f"{config.model.schedule.name} lr {config.model.schedule.learning_rate}, warm-up "
          f"{config.model.schedule.warmup_epochs} epoch(s)", flush=True)
    train_batches = read_batches(config.data, steps)
    eval_batches = read_batches(config.eval_data.model_copy(update={"repeat": 1}), None)
    info = Pipeline.from_config(config.data, target="cpu").source.info()
    byte_offset, vocab = info.byte_offset, config.train.num_classes or t.vocab_size or info.vocab_size
    length = train_batches[0][1].shape[1]
    real = sum(float((w > 0).sum()) for _, _, w in train_batches)
    print(f"{real:,.0f} real training tokens in {steps} batches of {train_batches[0][1].shape}; "
          f"{sum(float((w > 0).sum()) for _, _, w in eval_batches):,.0f} validation tokens", flush=True)
    train_set = as_dataset(train_batches)
    strategy = tf.distribute.get_strategy()

    def ours(overrides: Sequence[str]) -> Callable[[], Any]:
        def make() -> Any:
            cfg = load(args.config, list(args.override) + list(overrides))
            shapes = {name: [length] for name in (TOKENS, SEGMENTS, POSITIONS)}
            return build_model(cfg.model, strategy=strategy, kind="cpu", input_shape=shapes, num_classes=vocab,
                               steps_per_epoch=steps_per_epoch, epochs=epochs, task="language_model",
                               byte_offset=byte_offset)
        return make

    def reference(dense_norm_clip: bool = False) -> Callable[[], Any]:
        def make() -> Any:
            model = reference_model(vocab, length, t.width, t.depth, t.heads, t.mlp_dim or 4 * t.width)
            optimizer = reference_optimizer(config, steps_per_epoch, epochs)
            if dense_norm_clip:  # the clip by the gradient's true norm, as ours clips (model/optimizers.py)
                clip_summed_slices(optimizer)
            model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            return model
        return make

    runs: list[tuple[str, Callable[[], Any]]] = []
    if not args.no_reference:
        runs.append(("reference (tf_keras)", reference()))
    if args.reference_dense_clip:
        runs.append(("reference, true-norm clip", reference(dense_norm_clip=True)))
    if not args.no_default:
        runs.append(("ours (config)", ours([])))
    for spec in args.variant:
        name, _, overrides = spec.partition(":")
        runs.append((name, ours([o for o in overrides.split(",") if o])))
    results = [train(name, make, train_set, steps, eval_batches, byte_offset, args.seed) for name, make in runs]

    base = results[0]
    print(f"\n{'model':<28} {'val nats/token':>15} {'bits/byte':>10} {'minus ' + base['name'][:14]:>22}")
    for r in results:
        print(f"{r['name']:<28} {r['nats_per_token']:>15.4f} {r.get('bits_per_byte', float('nan')):>10.4f} "
              f"{r['nats_per_token'] - base['nats_per_token']:>+22.4f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"steps": steps, "epochs": epochs, "seed": args.seed, "steps_per_epoch": steps_per_epoch,
                       "config": args.config, "overrides": args.override, "results": results}, handle, indent=2)


if __name__ == "__main__":
    main()

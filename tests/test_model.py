"""Tests of the model layer: architectures, schedules, precision, config errors, multi-replica fit.

The multi-replica tests use the conftest's 8 logical CPUs (a real 8-replica MirroredStrategy), so
steps_per_execution and synchronized batch norm run through the same code paths as on a TPU host.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import tensorflow as tf

from tpu_pipeline.config.model import ModelConfig
from tpu_pipeline.errors import ConfigError
from tpu_pipeline.model import (
    build_model,
    build_network,
    build_schedule,
    resolve_precision,
    resolve_steps_per_execution,
    tf_keras,
)
from tpu_pipeline.model.schedules import schedule_steps, warmup_note

pytestmark = pytest.mark.tf_builds


def config(**data) -> ModelConfig:
    return ModelConfig.from_dict(data)


def default_strategy() -> tf.distribute.Strategy:
    return tf.distribute.get_strategy()


def count_layers(model, cls) -> int:
    return sum(isinstance(layer, cls) for layer in model.layers)


# --- architectures -------------------------------------------------------------------------------


def test_mlp_output_shape_and_exact_parameter_count():
    model = build_network(tf_keras, config(architecture="mlp", mlp={"hidden_units": [32]}), [10], 3)
    assert model.output_shape == (None, 3)
    assert model.count_params() == (10 * 32 + 32) + (32 * 3 + 3)
    assert model.predict(np.zeros((5, 10), "float32"), verbose=0).shape == (5, 3)


def test_mlp_flattens_image_input():
    model = build_network(tf_keras, config(architecture="mlp", mlp={"hidden_units": [8]}), [4, 4, 2], 2)
    assert model.count_params() == (32 * 8 + 8) + (8 * 2 + 2)


def test_cnn_output_shape_and_exact_parameter_count():
    model = build_network(tf_keras, config(architecture="cnn", cnn={"filters": [8, 16]}), [16, 16, 3], 5)
    assert model.output_shape == (None, 5)
    conv = 3 * 3 * 3 * 8 + 3 * 3 * 8 * 16  # no biases: batch norm follows
    bn = 4 * (8 + 16)  # gamma, beta, moving mean, moving variance
    assert model.count_params() == conv + bn + (16 * 5 + 5)
    assert count_layers(model, tf_keras.layers.MaxPooling2D) == 2


@pytest.mark.parametrize(
    "block, blocks_per_stage, expected_convs",
    [
        # stem + 2 per basic block + a projection at each stage after the first
        ("basic", [1, 1, 1], 1 + 2 * 3 + 2),
        ("basic", [2, 2, 2], 1 + 2 * 6 + 2),
        ("basic", [3, 1], 1 + 2 * 4 + 1),
        # stem + 3 per bottleneck block + a projection at every stage (4x expansion)
        ("bottleneck", [1, 2], 1 + 3 * 3 + 2),
    ],
)
def test_resnet_depth_sets_the_number_of_conv_layers(block, blocks_per_stage, expected_convs):
    cfg = config(architecture="resnet", resnet={"blocks_per_stage": blocks_per_stage, "width": 4, "block": block})
    model = build_network(tf_keras, cfg, [16, 16, 3], 7)
    assert model.output_shape == (None, 7)
    assert count_layers(model, tf_keras.layers.Conv2D) == expected_convs
    assert count_layers(model, tf_keras.layers.Add) == sum(blocks_per_stage)
    # Each stage after the first halves the feature map: 16 → 8 → 4.
    last_add = [layer for layer in model.layers if isinstance(layer, tf_keras.layers.Add)][-1]
    side = 16 // 2 ** (len(blocks_per_stage) - 1)
    assert last_add.output_shape[1:3] == (side, side)


def test_resnet_width_scales_parameters_quadratically():
    def params(width: int) -> int:
        cfg = config(architecture="resnet", resnet={"blocks_per_stage": [1, 1], "width": width})
        return build_network(tf_keras, cfg, [8, 8, 3], 10).count_params()

    ratio = params(32) / params(16)
    assert 3.5 < ratio < 4.1, ratio  # conv weights dominate and grow with width**2


def test_resnet_imagenet_stem_downsamples_by_four():
    cfg = config(architecture="resnet", resnet={"blocks_per_stage": [1], "width": 4, "stem": "imagenet"})
    model = build_network(tf_keras, cfg, [32, 32, 3], 2)
    assert model.get_layer("stem_pool").output_shape == (None, 8, 8, 4)


@pytest.mark.parametrize("architecture", ["cnn", "resnet"])
def test_image_architectures_refuse_flat_features(architecture):
    with pytest.raises(ConfigError, match=r"model\.architecture.*\[16\].*mlp"):
        build_network(tf_keras, config(architecture=architecture), [16], 3)


# --- learning-rate schedules ---------------------------------------------------------------------


def lr(schedule, step: int) -> float:
    return float(schedule(step))


def test_cosine_schedule_with_warmup_values():
    cfg = config(schedule={"name": "cosine", "learning_rate": 0.1, "warmup_epochs": 1, "final_fraction": 0.1})
    schedule = build_schedule(tf_keras, cfg.schedule, steps_per_epoch=10, epochs=5)  # 10 warm-up, 40 decay
    assert isinstance(schedule, tf_keras.optimizers.schedules.LearningRateSchedule)
    assert lr(schedule, 0) == pytest.approx(0.0, abs=1e-7)
    assert lr(schedule, 5) == pytest.approx(0.05, rel=1e-5)
    assert lr(schedule, 10) == pytest.approx(0.1, rel=1e-5)  # end of warm-up: the peak
    assert lr(schedule, 30) == pytest.approx(0.1 * (0.9 * 0.5 + 0.1), rel=1e-5)  # half-way down
    assert lr(schedule, 50) == pytest.approx(0.01, rel=1e-5)  # last step: final_fraction * peak
    assert lr(schedule, 500) == pytest.approx(0.01, rel=1e-5)


def test_cosine_schedule_without_warmup_starts_at_the_peak():
    cfg = config(schedule={"learning_rate": 0.2})
    schedule = build_schedule(tf_keras, cfg.schedule, steps_per_epoch=4, epochs=2)
    assert lr(schedule, 0) == pytest.approx(0.2, rel=1e-6)
    assert lr(schedule, 4) == pytest.approx(0.1, rel=1e-5)
    assert lr(schedule, 8) == pytest.approx(0.0, abs=1e-7)


def test_constant_schedule_with_and_without_warmup():
    warm = build_schedule(
        tf_keras, config(schedule={"name": "constant", "learning_rate": 0.4, "warmup_epochs": 0.5}).schedule,
        steps_per_epoch=20, epochs=3,
    )
    assert [lr(warm, s) for s in (0, 5, 10, 11, 59, 1000)] == pytest.approx([0.0, 0.2, 0.4, 0.4, 0.4, 0.4])
    flat = build_schedule(tf_keras, config(schedule={"name": "constant", "learning_rate": 0.3}).schedule,
                          steps_per_epoch=None, epochs=1)
    assert lr(flat, 0) == pytest.approx(0.3) and lr(flat, 10**6) == pytest.approx(0.3)


def test_schedule_serializes_and_restores_the_same_values():
    cfg = config(schedule={"learning_rate": 0.1, "warmup_epochs": 2, "final_fraction": 0.05})
    schedule = build_schedule(tf_keras, cfg.schedule, steps_per_epoch=10, epochs=6)
    restored = tf_keras.optimizers.schedules.deserialize(tf_keras.optimizers.schedules.serialize(schedule))
    for step in (0, 7, 20, 41, 60):
        assert lr(restored, step) == pytest.approx(lr(schedule, step), rel=1e-6)


def test_schedule_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"model\.schedule\.name='cosine'.*steps_per_epoch"):
        build_schedule(tf_keras, config().schedule, steps_per_epoch=None, epochs=3)


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_a_warmup_that_covers_the_whole_run_shrinks_to_half_of_it_and_says_so(name):
    # The smoke test `train.epochs=1` on a config written with warmup_epochs: 1 (the demo's) runs.
    cfg = config(schedule={"name": name, "learning_rate": 0.1, "warmup_epochs": 3}).schedule
    assert schedule_steps(cfg, steps_per_epoch=10, epochs=3) == (15, 30)
    schedule = build_schedule(tf_keras, cfg, steps_per_epoch=10, epochs=3)
    assert lr(schedule, 15) == pytest.approx(0.1, rel=1e-5)  # the peak, at the end of the shrunk warm-up
    assert lr(schedule, 7) < lr(schedule, 14) < 0.1
    if name == "cosine":
        assert lr(schedule, 30) == pytest.approx(0.0, abs=1e-7)  # and then half the run to decay
    assert warmup_note(cfg, 10, 3) == (
        "model.schedule.warmup_epochs=3 (30 steps) covers the whole 3-epoch run (30 steps): warming up over its "
        "first 15 steps (half the run) instead; set model.schedule.warmup_epochs below 3 to choose")
    one_step = config(schedule={"name": name, "warmup_epochs": 1}).schedule
    assert schedule_steps(one_step, steps_per_epoch=1, epochs=1) == (0, 1)
    assert "(1 step): no warm-up instead (a run of one step)" in warmup_note(one_step, 1, 1)


def test_a_warmup_shorter_than_the_run_is_kept_and_not_mentioned():
    cfg = config(schedule={"warmup_epochs": 2.5}).schedule
    assert schedule_steps(cfg, steps_per_epoch=10, epochs=3) == (25, 30)
    assert warmup_note(cfg, 10, 3) is None


# --- precision and steps_per_execution per accelerator kind ---------------------------------------


@pytest.mark.parametrize(
    "precision, kind, expected",
    [
        ("auto", "tpu", "mixed_bfloat16"),
        ("auto", "gpu", "float32"),
        ("auto", "cpu", "float32"),
        ("auto", "multi-worker", "float32"),
        ("mixed_float16", "gpu", "mixed_float16"),
        ("float32", "tpu", "float32"),
        ("mixed_bfloat16", "cpu", "mixed_bfloat16"),
    ],
)
def test_precision_resolution(precision, kind, expected):
    assert resolve_precision(precision, kind) == expected


@pytest.mark.parametrize("kind", ["tpu", "cpu"])
def test_mixed_float16_refused_off_gpu(kind):
    with pytest.raises(ConfigError, match=rf"model\.precision: mixed_float16 is for GPUs.*{kind}"):
        resolve_precision("mixed_float16", kind)


def test_unknown_kind_is_refused():
    with pytest.raises(ConfigError, match=r"kind: unknown accelerator kind 'TPU'"):
        resolve_precision("auto", "TPU")


@pytest.mark.parametrize(
    "kind, steps_per_epoch, expected", [("tpu", 1000, 32), ("tpu", 10, 10), ("tpu", None, 32), ("gpu", 1000, 1)]
)
def test_auto_steps_per_execution(kind, steps_per_epoch, expected):
    assert resolve_steps_per_execution(config(), kind, 8, steps_per_epoch) == expected


def test_tpu_build_uses_bfloat16_inside_float32_logits_and_restores_the_policy():
    cfg = config(architecture="cnn", cnn={"filters": [4]})
    model = build_model(cfg, strategy=default_strategy(), kind="tpu", input_shape=[8, 8, 3], num_classes=3,
                        steps_per_epoch=100, epochs=1)
    assert model.get_layer("conv_0").compute_dtype == "bfloat16"
    assert model.get_layer("conv_0").dtype == "float32"  # variables stay float32
    assert model.get_layer("logits").compute_dtype == "float32"
    assert model.predict(np.ones((2, 8, 8, 3), "float32"), verbose=0).dtype == np.float32
    assert int(model._steps_per_execution.numpy()) == 32
    assert tf_keras.mixed_precision.global_policy().name == "float32"  # nothing leaks to the next build


def test_gpu_mixed_float16_wraps_the_optimizer_in_loss_scaling():
    cfg = config(architecture="mlp", mlp={"hidden_units": [4]}, precision="mixed_float16")
    model = build_model(cfg, strategy=default_strategy(), kind="gpu", input_shape=[6], num_classes=2,
                        steps_per_epoch=10, epochs=1)
    assert model.get_layer("dense_0").compute_dtype == "float16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert isinstance(model.optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    assert tf_keras.mixed_precision.global_policy().name == "float32"


# --- optimizer and loss --------------------------------------------------------------------------


def compiled(**data):
    cfg = config(architecture="mlp", mlp={"hidden_units": [4]}, **data)
    return build_model(cfg, strategy=default_strategy(), kind="cpu", input_shape=[3], num_classes=2,
                       steps_per_epoch=10, epochs=2)


def test_optimizers_from_config():
    sgd = compiled(optimizer={"name": "sgd", "momentum": 0.8, "nesterov": True}).optimizer
    assert isinstance(sgd, tf_keras.optimizers.SGD)
    assert sgd.momentum == pytest.approx(0.8) and sgd.nesterov is True
    assert isinstance(sgd._learning_rate, tf_keras.optimizers.schedules.CosineDecay)
    adam = compiled(optimizer={"name": "adam", "beta_2": 0.98}).optimizer
    assert isinstance(adam, tf_keras.optimizers.Adam) and adam.beta_2 == pytest.approx(0.98)
    assert not adam.weight_decay
    adamw = compiled(optimizer={"name": "adamw"}).optimizer
    assert isinstance(adamw, tf_keras.optimizers.AdamW)
    assert adamw.weight_decay == pytest.approx(0.004)
    assert adamw._exclude_from_weight_decay_names == ["bias", "gamma", "beta"]


def test_loss_and_metric_follow_the_label_format():
    sparse = compiled()
    assert isinstance(sparse.loss, tf_keras.losses.SparseCategoricalCrossentropy)
    assert sparse.loss.get_config()["from_logits"] is True
    onehot = compiled(loss="categorical_crossentropy", label_smoothing=0.1)
    assert isinstance(onehot.loss, tf_keras.losses.CategoricalCrossentropy)
    assert onehot.loss.get_config()["label_smoothing"] == pytest.approx(0.1)
    history = onehot.fit(np.ones((4, 3), "float32"), np.eye(2, dtype="float32")[[0, 1, 0, 1]],
                         epochs=1, verbose=0)
    assert set(history.history) == {"loss", "accuracy", "cross_entropy"}  # weighted metrics: exact evaluation


# --- config validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, pattern",
    [
        ({"resnet": {"depth": 50}}, r"model\.resnet\.depth: unknown key; allowed keys here: block, blocks_per_stage"),
        ({"resnet": {"width": "wide"}}, r"model\.resnet\.width"),
        ({"resnet": {"blocks_per_stage": []}}, r"model\.resnet\.blocks_per_stage"),
        ({"architecture": "vit"}, r"model\.architecture"),
        ({"keras": "keras2"}, r"model\.keras"),
        ({"steps_per_execution": 0}, r"model\.steps_per_execution"),
        ({"precision": "float16"}, r"model\.precision"),
        ({"optimizer": {"name": "lamb"}}, r"model\.optimizer\.name"),
        ({"schedule": {"learning_rate": -1}}, r"model\.schedule\.learning_rate"),
        ({"optimizer": {"name": "adam", "momentum": 0.9}},
         r"model\.optimizer\.momentum is set but model\.optimizer\.name is 'adam'"),
        ({"schedule": {"name": "constant", "final_fraction": 0.1}}, r"model\.schedule\.final_fraction"),
        ({"label_smoothing": 0.1}, r"model\.label_smoothing is set but model\.loss"),
    ],
)
def test_config_errors_name_the_key(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        ModelConfig.from_dict(data)


def test_inactive_architecture_blocks_are_allowed_so_overrides_can_switch():
    cfg = ModelConfig.from_dict({"architecture": "mlp", "resnet": {"width": 8}, "cnn": {"filters": [4]}})
    assert cfg.architecture == "mlp" and cfg.resnet.width == 8 and cfg.cnn.filters == [4]


def test_config_defaults():
    cfg = ModelConfig()
    assert (cfg.keras, cfg.architecture, cfg.precision, cfg.steps_per_execution) == (
        "tf_keras", "resnet", "auto", "auto")
    assert (cfg.optimizer.name, cfg.schedule.name, cfg.loss) == ("sgd", "cosine", "sparse_categorical_crossentropy")


# --- 8 replicas -----------------------------------------------------------------------------------

GLOBAL_BATCH = 64


def distributed(strategy, features, labels, global_batch=GLOBAL_BATCH):
    """Per-replica batches from one global batch size, as the pipeline layer will feed them."""

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((features, labels))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        return ds.shuffle(len(labels), seed=0).repeat().batch(batch, drop_remainder=True)

    return strategy.distribute_datasets_from_function(dataset_fn)


def linear_problem(n: int = 1024, dims: int = 8, classes: int = 4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, dims)).astype("float32")
    y = np.argmax(x @ rng.normal(size=(dims, classes)), axis=1).astype("int32")
    return x, y


def test_eight_replicas_fit_with_steps_per_execution_4_learns(eight_replica_strategy):
    tf_keras.utils.set_random_seed(0)
    x, y = linear_problem()
    steps, epochs = len(y) // GLOBAL_BATCH, 3
    cfg = config(architecture="mlp", mlp={"hidden_units": [32]}, optimizer={"name": "adam"},
                 schedule={"learning_rate": 0.01, "warmup_epochs": 0.25}, steps_per_execution=4)
    model = build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8], num_classes=4,
                        steps_per_epoch=steps, epochs=epochs)
    assert int(model._steps_per_execution.numpy()) == 4
    history = model.fit(distributed(eight_replica_strategy, x, y), epochs=epochs, steps_per_epoch=steps, verbose=0)
    losses = history.history["loss"]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.7 * losses[0], losses
    assert history.history["accuracy"][-1] > 0.7
    assert int(model.optimizer.iterations.numpy()) == steps * epochs  # every step ran, 4 per call


def test_the_train_jobs_model_traces_its_training_step_once(eight_replica_strategy):
    """The run's checkpoint builds the optimizer's slots under the strategy (model/checkpointed.py): left to
    fit's first step, tf_keras creates them inside the traced step and tf.function traces it a second time
    (3 of a language-model run's 18 s, on every start and resume)."""
    from tpu_pipeline.model.checkpointed import CheckpointedModel

    x, y = linear_problem(n=128)
    cfg = config(architecture="mlp", mlp={"hidden_units": [8]}, optimizer={"name": "adam"}, steps_per_execution=2)
    model = build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8], num_classes=4,
                        steps_per_epoch=2, epochs=1)
    CheckpointedModel(model)
    slots = [v for v in model.optimizer.variables if v is not model.optimizer.iterations]
    assert len(slots) == 2 * len(model.trainable_variables)  # Adam's two moments, before any step
    assert all(isinstance(v, tf.distribute.DistributedValues) for v in slots), "slots made outside the strategy"
    model.fit(distributed(eight_replica_strategy, x, y), epochs=1, steps_per_epoch=2, verbose=0)
    assert model.train_function.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("synchronized", [True, False])
def test_eight_replicas_synchronized_batch_norm_trains(eight_replica_strategy, synchronized):
    tf_keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    images = rng.normal(size=(128, 8, 8, 3)).astype("float32") * rng.uniform(0.5, 2, (128, 1, 1, 1))
    labels = rng.integers(0, 3, 128).astype("int32")
    cfg = config(architecture="resnet", resnet={"blocks_per_stage": [1], "width": 4},
                 batch_norm={"synchronized": synchronized}, optimizer={"name": "sgd"},
                 schedule={"name": "constant", "learning_rate": 0.01})
    model = build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8, 8, 3], num_classes=3,
                        steps_per_epoch=2, epochs=1)
    stem_bn = model.get_layer("stem_bn")
    assert stem_bn.synchronized is synchronized
    history = model.fit(distributed(eight_replica_strategy, images, labels, global_batch=32),
                        epochs=1, steps_per_epoch=2, verbose=0)
    assert math.isfinite(history.history["loss"][0])
    # Each replica keeps its own moving statistics: equal across replicas only when the batch
    # statistics were computed over the global batch.
    per_replica = [v.numpy() for v in stem_bn.moving_mean.values]
    assert len(per_replica) == 8
    same = all(np.allclose(per_replica[0], other, atol=1e-6) for other in per_replica[1:])
    assert same is synchronized
    assert not np.allclose(per_replica[0], 0.0)  # the statistics did move


# --- Keras 3 guard ---------------------------------------------------------------------------------


def test_keras3_refuses_explicit_steps_per_execution_with_several_replicas(eight_replica_strategy):
    cfg = config(keras="keras3", architecture="mlp", steps_per_execution=4)
    with pytest.raises(ConfigError, match=r"model\.steps_per_execution: 4 with model\.keras=keras3 and 8 replicas"):
        build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8], num_classes=4,
                    steps_per_epoch=16, epochs=1)


def test_keras3_auto_steps_per_execution_falls_back_to_1_with_a_warning(caplog):
    cfg = config(keras="keras3")
    with caplog.at_level(logging.WARNING, logger="tpu_pipeline.model"):
        assert resolve_steps_per_execution(cfg, "tpu", 8, 1000) == 1
    assert "steps_per_execution 'auto' set to 1 instead of 32" in caplog.text
    assert resolve_steps_per_execution(config(keras="keras3", steps_per_execution=4), "cpu", 1, 100) == 4


def test_keras3_builds_and_fits_on_eight_replicas_with_one_step_per_execution(eight_replica_strategy):
    keras = pytest.importorskip("keras")
    x, y = linear_problem(n=512)
    cfg = config(keras="keras3", architecture="mlp", mlp={"hidden_units": [16]}, optimizer={"name": "adam"},
                 schedule={"name": "constant", "learning_rate": 0.01})
    model = build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8], num_classes=4,
                        steps_per_epoch=8, epochs=1)
    assert isinstance(model, keras.Model) and not isinstance(model, tf_keras.Model)
    history = model.fit(distributed(eight_replica_strategy, x, y), epochs=1, steps_per_epoch=8, verbose=0,
                        shuffle=False)
    assert math.isfinite(history.history["loss"][0])


def test_keras3_fit_takes_no_batch_of_its_own_after_build_for_input(eight_replica_strategy):
    """Keras 3's TF trainer starts `fit` and `evaluate` with `_maybe_symbolic_build(iterator=...)`, which takes a
    batch from their iterator even when all is built: after `build_for_input` (what `train` calls) it must take
    none, or a windowed pipeline's position log runs a batch ahead of the steps and a resume repeats it."""
    from tpu_pipeline.model import get_keras
    from tpu_pipeline.model.keras_backend import build_for_input

    keras = get_keras("keras3")  # Keras 3 ships with TensorFlow 2.16+: its absence is a failure, not a skip
    x, y = linear_problem(n=256)
    cfg = config(keras="keras3", architecture="mlp", mlp={"hidden_units": [16]})
    model = build_model(cfg, strategy=eight_replica_strategy, kind="cpu", input_shape=[8], num_classes=4,
                        steps_per_epoch=4, epochs=1)
    assert isinstance(model, keras.Model)
    dataset = distributed(eight_replica_strategy, x, y)
    build_for_input(model, dataset.element_spec)
    assert model._compile_loss.built and model._compile_metrics.built  # built from the spec, before fit
    taken: list = []

    def batches():
        for batch in dataset:
            taken.append(batch)
            yield batch

    model._maybe_symbolic_build(iterator=[(0, 0, batches())])  # fit's epoch iterator: (begin, end, iterator)
    assert len(taken) == 0, "fit's first batch went to the symbolic build: the input ran a batch ahead"


def _keras_on_tensorflow():
    """The Kerases whose embedding gradients are tf.IndexedSlices here: tf_keras, and Keras 3 when this
    process imports it on the TensorFlow backend."""
    kerases = [tf_keras]
    try:
        import keras
    except ImportError:
        return kerases
    return kerases + [keras] if keras.backend.backend() == "tensorflow" else kerases


@pytest.mark.parametrize("keras", _keras_on_tensorflow(), ids=lambda k: k.__name__)
def test_global_clipnorm_reads_an_embedding_gradient_as_its_dense_sum(keras):
    """Issue 47 item 1: tf_keras clipped an embedding's gradient by the norm of its per-occurrence rows,
    smaller than the gradient's when a token repeats, so the TensorFlow path clipped less than JAX (whose
    gradients are dense) and trained apart from the same weights. The step from the sparse gradient must be
    the step from its dense equivalent."""
    from tpu_pipeline.model.optimizers import build_optimizer
    from tpu_pipeline.config.model import OptimizerConfig

    ids = tf.constant([0, 0, 1, 2, 2, 2, 0])
    scale = tf.constant(np.random.default_rng(0).normal(size=(7, 3)), tf.float32)

    def step(dense: bool) -> np.ndarray:
        table = keras.layers.Embedding(4, 3, embeddings_initializer="zeros")
        table.build((None,))
        optimizer = build_optimizer(keras, OptimizerConfig(name="sgd", momentum=0.0, global_clipnorm=1.0), 1.0)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(ids) * scale)
        grads = tape.gradient(loss, table.trainable_variables)
        assert isinstance(grads[0], tf.IndexedSlices)  # what an embedding lookup's gradient is on TensorFlow
        if dense:
            grads = [tf.convert_to_tensor(grad) for grad in grads]
        optimizer.apply_gradients(zip(grads, table.trainable_variables))
        return np.asarray(table.embeddings.numpy())

    dense = step(dense=True)
    assert np.linalg.norm(dense) == pytest.approx(1.0, rel=1e-5)  # clipped to the global norm
    np.testing.assert_allclose(step(dense=False), dense, rtol=1e-5, atol=1e-7)


def test_the_attention_kernels_start_alike_on_both_kerases():
    """Issue 47 item 1: Keras 3.15 gives its Glorot the attention kernels' true axes (a standard deviation four
    times tf_keras's for the query, key and value), so from each framework's own draw the two trained apart.
    Every kernel of our Transformer starts from the same distribution on both."""
    keras3 = pytest.importorskip("keras")
    if not hasattr(keras3, "ops"):
        pytest.skip("no Keras 3 here")
    section = {"architecture": "transformer", "keras": "keras3",
               "transformer": {"width": 64, "depth": 1, "heads": 4, "mlp_dim": 128, "vocab_size": 50}}
    spreads = {}
    for keras in (tf_keras, keras3):
        model = build_network(keras, ModelConfig.from_dict(section), {"tokens": [16]}, 50, task="language_model")
        spreads[keras.__name__] = {(getattr(w, "path", None) or w.name).removesuffix(":0"): float(np.std(w.numpy()))
                                   for w in model.weights if "kernel" in w.name or "embeddings" in w.name}
    ours, theirs = spreads["tf_keras"], spreads["keras"]
    assert sorted(ours) == sorted(theirs) and any("attention/query" in name for name in ours), (ours, theirs)
    for name, spread in ours.items():
        assert theirs[name] == pytest.approx(spread, rel=0.1), (name, spread, theirs[name])

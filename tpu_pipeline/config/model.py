"""The `model` config section: which network, which Keras, and how it is compiled.

One section per architecture and per optimizer family keeps every knob typed. A knob that the
chosen architecture/optimizer would not read is an error when set explicitly (never silently
ignored), e.g. `model.resnet.width` with `model.architecture: mlp`.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

import pydantic

from tpu_pipeline.config.base import StrictModel, validate
from tpu_pipeline.errors import ConfigError

KerasName = Literal["tf_keras", "keras3"]
Framework = Literal["tensorflow", "jax"]
Precision = Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"]
Fraction = pydantic.confloat(ge=0.0, lt=1.0)


def _refuse_unused(config: pydantic.BaseModel, where: str, owners: dict[str, tuple[str, ...]],
                   chosen_key: str, chosen: str) -> None:
    """Raises when a field set explicitly is read only by a choice other than `chosen`."""
    for field, used_by in owners.items():
        if field in config.model_fields_set and chosen not in used_by:
            raise ConfigError(
                f"{where}.{field} is set but {where}.{chosen_key} is {chosen!r}, which does not use "
                f"it (only {', '.join(used_by)} does); remove {where}.{field} or change "
                f"{where}.{chosen_key}"
            )


class MlpConfig(StrictModel):
    """Fully connected network; image inputs are flattened first."""

    hidden_units: list[pydantic.PositiveInt] = [256, 256]
    dropout: Fraction = 0.0


class CnnConfig(StrictModel):
    """Small CNN: per entry of `filters`, conv3x3 → BN → ReLU → 2x2 max-pool; then global pool."""

    filters: list[pydantic.PositiveInt] = pydantic.Field([32, 64, 128], min_length=1)
    dropout: Fraction = 0.0


class ResNetConfig(StrictModel):
    """ResNet (v1.5 style). Depth = blocks per stage; stage i has width * 2**i filters."""

    blocks_per_stage: list[pydantic.PositiveInt] = pydantic.Field(
        [2, 2, 2], min_length=1, description="e.g. [3, 4, 6, 3] with bottleneck blocks is ResNet-50"
    )
    width: pydantic.PositiveInt = pydantic.Field(16, description="filters of the first stage")
    block: Literal["basic", "bottleneck"] = "basic"
    stem: Literal["small", "imagenet"] = pydantic.Field(
        "small", description="small: conv3x3 (CIFAR-size images); imagenet: conv7x7/2 + maxpool/2"
    )


class TransformerConfig(StrictModel):
    """A pre-norm Transformer over token ids (`architecture: transformer`): a decoder-only language model
    (causal) for `train.task: language_model`, an encoder classifier for `classification`. Attention is
    masked by `<tokens>_segment_ids` (or `<tokens>_mask`), so no token attends across packed examples;
    positions come from `<tokens>_positions` when the data has them."""

    width: pydantic.PositiveInt = pydantic.Field(256, description="model (embedding) width")
    depth: pydantic.PositiveInt = pydantic.Field(4, description="Transformer blocks")
    heads: pydantic.PositiveInt = pydantic.Field(4, description="attention heads; must divide width")
    mlp_dim: Optional[pydantic.PositiveInt] = pydantic.Field(None, description="None: 4 * width")
    dropout: Fraction = pydantic.Field(0.0, description="after attention and MLP, and on the embeddings")
    attention_dropout: Fraction = 0.0
    tie_embeddings: bool = pydantic.Field(
        False, description="language model: the logits reuse the token embedding matrix (fewer parameters; its "
        "input rows are scaled by sqrt(width), as Gemma does). Off by default: measured, tying cost 0.1-0.3 nats per "
        "token on the text demo at its budget (benchmarks/bench_lm_quality.py)"
    )
    vocab_size: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="None: train.num_classes for a language model (which must equal it when both are set), "
        "else the dataset's tokenizer vocabulary (metadata.json)"
    )
    max_length: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="rows of the position embedding; None: the static sequence length of the inputs"
    )
    tokens_key: Optional[str] = pydantic.Field(
        None, description="the input holding token ids; None: the one input not ending in _segment_ids, "
        "_positions or _mask"
    )
    causal: Optional[bool] = pydantic.Field(
        None, description="None: causal for train.task language_model, bidirectional for classification"
    )
    pooling: Literal["mean", "first"] = pydantic.Field(
        "mean", description="classification: mean over the example's tokens, or its first token"
    )

    @pydantic.model_validator(mode="after")
    def _check_heads(self) -> "TransformerConfig":
        if self.width % self.heads:
            raise ConfigError(f"model.transformer.heads={self.heads} must divide model.transformer.width={self.width}")
        return self


class BatchNormConfig(StrictModel):
    """Batch norm of the cnn/resnet. synchronized=True averages batch statistics over replicas."""

    synchronized: bool = pydantic.Field(
        False, description="cross-replica statistics; worth it when the per-replica batch is small"
    )
    momentum: pydantic.confloat(gt=0.0, lt=1.0) = 0.9
    epsilon: pydantic.PositiveFloat = 1e-5


class OptimizerConfig(StrictModel):
    """Optimizer. weight_decay is decoupled (scaled by the learning rate); norms/biases are exempt."""

    name: Literal["sgd", "adam", "adamw"] = "sgd"
    momentum: pydantic.confloat(ge=0.0, lt=1.0) = 0.9
    nesterov: bool = False
    beta_1: pydantic.confloat(ge=0.0, lt=1.0) = 0.9
    beta_2: pydantic.confloat(ge=0.0, lt=1.0) = 0.999
    epsilon: pydantic.PositiveFloat = 1e-7
    weight_decay: Optional[pydantic.NonNegativeFloat] = pydantic.Field(
        None, description="None: 0 for sgd/adam, 0.004 (Keras's AdamW default) for adamw"
    )
    global_clipnorm: Optional[pydantic.PositiveFloat] = None

    @pydantic.model_validator(mode="after")
    def _check_unused(self) -> "OptimizerConfig":
        _refuse_unused(
            self, "model.optimizer",
            {"momentum": ("sgd",), "nesterov": ("sgd",), "beta_1": ("adam", "adamw"),
             "beta_2": ("adam", "adamw"), "epsilon": ("adam", "adamw")},
            "name", self.name,
        )
        return self


class ScheduleConfig(StrictModel):
    """Learning rate: linear warm-up from 0 to `learning_rate`, then cosine decay or constant."""

    name: Literal["cosine", "constant"] = "cosine"
    learning_rate: pydantic.PositiveFloat = pydantic.Field(0.1, description="peak, reached after warm-up")
    warmup_epochs: pydantic.NonNegativeFloat = 0.0
    final_fraction: pydantic.confloat(ge=0.0, le=1.0) = pydantic.Field(
        0.0, description="cosine only: the last step's rate as a fraction of learning_rate"
    )

    @pydantic.model_validator(mode="after")
    def _check_unused(self) -> "ScheduleConfig":
        _refuse_unused(self, "model.schedule", {"final_fraction": ("cosine",)}, "name", self.name)
        return self


class ModelConfig(StrictModel):
    """Everything `tpu_pipeline.model.build_model` needs besides the strategy and the input spec."""

    framework: Optional[Framework] = pydantic.Field(
        None, description="what runs the model: tensorflow (tf.distribute: TPUStrategy, MirroredStrategy, ...) or jax "
        "(Keras 3 on JAX with keras.distribution: how Keras runs current TPUs; needs the jax extra). None: jax when "
        "KERAS_BACKEND=jax, else tensorflow; a config and KERAS_BACKEND that disagree are refused. The input "
        "pipelines are TensorFlow's either way",
    )
    keras: KerasName = pydantic.Field(
        "tf_keras",
        description="tf_keras works with TPUStrategy and steps_per_execution under MirroredStrategy; "
        "keras3 refuses steps_per_execution>1 with several replicas (it fails in fit there)",
    )
    architecture: Literal["mlp", "cnn", "resnet", "transformer"] = pydantic.Field(
        "resnet", description="also accepted as model.name"
    )
    fn: Optional[str] = pydantic.Field(
        None, description="your model: 'package.module:function', called inside strategy.scope() as "
        "function(input_shape=[...], num_classes=N) and returning an uncompiled Keras model that outputs logits; "
        "replaces architecture"
    )
    application: Optional[str] = pydantic.Field(
        None, description="a keras.applications model by name (ResNet50, EfficientNetV2B0, MobileNetV3Small, ...) "
        "with a logits head for the class count; replaces architecture"
    )
    weights: Optional[str] = pydantic.Field(
        None, description="with application: null (random init) or 'imagenet' (downloaded; the top is replaced)"
    )
    mlp: MlpConfig = MlpConfig()
    cnn: CnnConfig = CnnConfig()
    resnet: ResNetConfig = ResNetConfig()
    transformer: TransformerConfig = TransformerConfig()
    batch_norm: BatchNormConfig = BatchNormConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    loss: Literal["sparse_categorical_crossentropy", "categorical_crossentropy"] = pydantic.Field(
        "sparse_categorical_crossentropy",
        description="sparse: integer labels; categorical: one-hot labels. Both from logits",
    )
    label_smoothing: Fraction = pydantic.Field(0.0, description="categorical_crossentropy only")
    steps_per_execution: Union[pydantic.PositiveInt, Literal["auto"]] = pydantic.Field(
        "auto", description="auto: 32 on TPU (capped at steps_per_epoch), 1 elsewhere"
    )
    precision: Precision = pydantic.Field(
        "auto", description="auto: mixed_bfloat16 on TPU, float32 elsewhere; mixed_float16 on GPU only"
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _name_is_architecture(cls, data: Any) -> Any:
        """`model.name: transformer` (the name other tools use) is `model.architecture`."""
        if isinstance(data, dict) and "name" in data:
            if "architecture" in data:
                raise ConfigError("model.name and model.architecture are the same key; keep one")
            data = {("architecture" if key == "name" else key): value for key, value in data.items()}
        return data

    @pydantic.model_validator(mode="after")
    def _check_framework(self) -> "ModelConfig":
        if self.framework == "jax" and self.keras == "tf_keras":
            if "keras" in self.model_fields_set:
                raise ConfigError("model.keras: tf_keras has no JAX backend, but model.framework is jax; "
                                  "remove model.keras (JAX runs Keras 3) or set model.framework: tensorflow")
            # Keras 3 is the only Keras on JAX: `framework: jax` alone says it (validate_assignment is off here).
            object.__setattr__(self, "keras", "keras3")
        return self

    @pydantic.model_validator(mode="after")
    def _check_model_source(self) -> "ModelConfig":
        if self.fn is not None and self.application is not None:
            raise ConfigError("model.fn and model.application are both set; keep the one that builds your model")
        if self.weights is not None and self.application is None:
            raise ConfigError("model.weights is set but model.application is not; weights apply to keras.applications models")
        if (self.fn is not None or self.application is not None) and "architecture" in self.model_fields_set:
            chosen = "fn" if self.fn is not None else "application"
            raise ConfigError(f"model.architecture is set but model.{chosen} replaces it; remove model.architecture")
        return self

    @pydantic.model_validator(mode="after")
    def _check_unused(self) -> "ModelConfig":
        # The per-architecture blocks (mlp, cnn, resnet, batch_norm) may all be present, so that
        # `model.architecture=cnn` can switch a config that also describes a resnet.
        _refuse_unused(
            self, "model", {"label_smoothing": ("categorical_crossentropy",)}, "loss", self.loss
        )
        return self

    @classmethod
    def from_dict(cls, data: dict[str, Any], prefix: str = "model") -> "ModelConfig":
        """Validates plain data (e.g. the `model:` YAML section), raising ConfigError on mistakes."""
        return validate(cls, data, prefix)

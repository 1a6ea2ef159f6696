"""The `data` config section: one typed place for every knob of one input pipeline.

Like tensorflow_datasets' ReadConfig, a single small model holds the read, preprocess, batching
and tf.data option knobs; unlike big_vision, an unknown key is an error, never ignored.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Sequence, Union

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.features import SEQUENCE_KINDS, FeatureConfig, OpConfig
from tpu_pipeline.config.mixture import MixtureConfig
from tpu_pipeline.config.sequence import SequenceConfig
from tpu_pipeline.config.sources import (  # noqa: F401  (re-exported: the data section's names)
    AUTOTUNE, REMOVED_KEYS, ArraySourceConfig, IntOrAutotune, SourceConfig, TFDSSourceConfig, TFRecordSourceConfig,
    _refuse_removed,
)
from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.errors import ConfigError


class CacheConfig(StrictModel):
    enabled: bool = pydantic.Field(False, description="cache the parsed, preprocessed examples (before augment)")
    path: str = pydantic.Field("", description="'' caches in memory; a path caches to files (one per input pipeline)")
    records: Union[Literal["auto"], bool] = pydantic.Field(
        "auto", description="hold the serialized TFRecord records in memory after the first epoch, so later "
        "epochs read no file, and shuffle all of them each epoch; auto: uncompressed files of at most 1 GiB "
        "and 1/8 of the available memory, a repeating pipeline, enabled false, shuffled records (or unshuffled "
        "files), and not batch-then-parse with shuffle.mode=stream"
    )


class ShuffleConfig(StrictModel):
    @pydantic.model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        return _refuse_removed(value, f"{(info.context or {}).get('prefix', 'data')}.shuffle", ("seed",))

    enabled: bool = True
    buffer_size: pydantic.PositiveInt = pydantic.Field(
        10_000, description="stream: elements held in the buffer; window: records per window"
    )
    mode: Literal["auto", "window", "stream"] = pydantic.Field(
        "auto", description="window: permute windows of buffer_size serialized records with one gather each "
        "(batch-then-parse only; ~2x faster on small records); stream: tf.data's shuffle buffer of "
        "buffer_size elements; auto: window when records are parsed in batches, else stream"
    )
    reshuffle_each_iteration: bool = pydantic.Field(True, description="false: the same order every epoch")


class OutputsConfig(StrictModel):
    """Turns the feature dict into the (inputs, targets) tuple Keras fit expects."""

    inputs: Union[str, list[str]] = "image"
    targets: Union[str, list[str], None] = "label"
    weights: Union[str, list[str], None] = pydantic.Field(
        None, description="feature(s) giving Keras's sample weights, third in the tuple: an integer feature "
        "weighs 1 where it is non-zero (segment ids, masks: each real token once, padding never), a float "
        "feature its value; several multiply. A language model on packed rows: targets_segment_ids"
    )


# What each data.sequence mode adds beside a key (pipeline/sequences/sequence_stages.py makes them;
# model/transformer.py reads them by these names).
SEQUENCE_INPUTS = {"pack": ("_segment_ids", "_positions"), "pad": ("_mask",), "bucket": ("_mask",)}
EXAMPLE_MASK = "example_mask"  # bucket mode: 0 on the examples that fill a bucket's last batches
# A per-token weight beside the tokens (1: learn this token, as an assistant's answer; 0: context only). `lm_shift`
# makes it each target's weight; as a sequence key it is packed, padded or bucketed with the tokens, and it weighs
# the loss and metrics instead of being an input.
LOSS_WEIGHTS = "loss_weights"
# The same weights carried inside the tokens, one int64 each: `2 * id + weight` (ops/weighted_values.py). What
# `convert --from chat` writes (one list a record, not two: a packed row costs about what an unweighted one does),
# and what `lm_shift` hands on: `weighted_<targets>` in place of `<targets>` and `loss_weights`, taken apart
# again in the rows (pipeline/sequences/carried_weights.py).
WEIGHTED_TOKENS = "weighted_tokens"
WEIGHTED_PREFIX = "weighted_"


def weighted_key(target: str) -> str:
    """The key that carries `target` and its loss weights in one value each (`weighted_targets`)."""
    return WEIGHTED_PREFIX + target


def weighted_target(keys: Sequence[str]) -> Optional[str]:
    """The sequence key a language model predicts, the one `loss_weights` weighs: `targets` (what {op: lm_shift}
    writes), else the last key but the weights; None without one."""
    tokens = [key for key in keys if key != LOSS_WEIGHTS]
    return "targets" if "targets" in tokens else (tokens[-1] if tokens else None)


def derived_outputs(sequence: Optional[SequenceConfig], task: str) -> Optional[OutputsConfig]:
    """The outputs a language model takes from a data.sequence pipeline, when the config gives none.

    The target key is `targets` (what {op: lm_shift} writes), else the last of sequence.keys; every
    other key is an input, with what its mode adds: pack → its segment ids and positions; pad and
    bucket → its mask. The weights leave padding out: the targets' segment ids (pack) or mask (pad),
    and in bucket mode also `example_mask` (the filler examples of a bucket's last batches); a `loss_weights`
    key weighs them too (it is no input). None for a classifier (its label is the user's to name) or a single
    key (nothing to predict it from)."""
    if sequence is None or not predicts_tokens(task):
        return None
    tokens = [key for key in sequence.keys if key != LOSS_WEIGHTS]
    if len(tokens) < 2:
        return None
    target = weighted_target(tokens)
    suffixes = SEQUENCE_INPUTS[sequence.mode]
    inputs = [name for key in tokens if key != target for name in (key, *(key + s for s in suffixes))]
    weights: list[str] = [target + suffixes[0]]
    if sequence.mode == "bucket":
        weights.insert(0, EXAMPLE_MASK)
    if LOSS_WEIGHTS in sequence.keys:
        weights.append(LOSS_WEIGHTS)
    return OutputsConfig(inputs=inputs, targets=target, weights=weights[0] if len(weights) == 1 else weights)


class OptionsConfig(StrictModel):
    """tf.data.Options, by their current (TF 2.16+) names. None leaves TensorFlow's default."""

    autotune: bool = True
    cpu_budget: Optional[pydantic.PositiveInt] = None
    ram_budget: Optional[pydantic.PositiveInt] = pydantic.Field(None, description="bytes")
    private_threadpool_size: Optional[pydantic.NonNegativeInt] = None
    max_intra_op_parallelism: Optional[pydantic.PositiveInt] = None
    deterministic: Optional[bool] = pydantic.Field(
        None, description="element order of the parallel stages; true: a fixed seed gives the same order every "
        "run; null: out of order for a tfrecord source (faster: a finished element need not wait behind a slow "
        "one), in order for other sources"
    )
    map_parallelization: Optional[bool] = None
    auto_shard_policy: Optional[Literal["auto", "file", "data", "hint", "off"]] = None
    slack: bool = False


def service_host_port(address: str) -> Optional[tuple[str, str]]:
    """(host, port) of a tf.data service address, `grpc://host:port` or `host:port`; None if it is neither."""
    host, _, port = address.removeprefix("grpc://").rpartition(":")
    return (host, port) if host and port.isdigit() and "://" not in host else None


class ServiceConfig(StrictModel):
    """data.service: run the pipeline up to its batches on tf.data service workers (`tpu-pipeline serve`)."""

    address: Optional[str] = pydantic.Field(
        None, description="the dispatcher, grpc://host:port; unset: the pipeline runs on this host"
    )
    mode: Literal["distributed_epoch", "parallel_epochs"] = pydantic.Field(
        "distributed_epoch", description="distributed_epoch: the workers split the data, so each example reaches "
        "one consumer once per epoch (at most once: a killed worker's unfinished split is lost); parallel_epochs: "
        "every worker runs the whole pipeline, so each example is read once per worker and epoch"
    )
    job_name: Optional[str] = pydantic.Field(
        None, description="consumers with the same job name share one stream (needed with several trainer hosts); "
        "use a new name per training run: a finished job's name delivers nothing"
    )
    num_consumers: Optional[pydantic.PositiveInt] = pydantic.Field(
        None, description="coordinated reads: the trainer hosts take batches round-robin, one worker per step "
        "(needs job_name, repeat: forever, and one consumer per host)"
    )
    compression: Literal["auto", "none"] = pydantic.Field(
        "auto", description="auto: batches are compressed for the network when that pays; none: never"
    )

    @pydantic.model_validator(mode="after")
    def _check(self, info: pydantic.ValidationInfo) -> "ServiceConfig":
        prefix = (info.context or {}).get("prefix", "data") + ".service"
        if self.address is not None:
            if service_host_port(self.address) is None:
                raise ConfigError(f"{prefix}.address={self.address!r}: expected grpc://host:port, e.g. "
                                  "grpc://10.0.0.2:5050 (the dispatcher of `tpu-pipeline serve dispatcher`)")
        if self.num_consumers is not None and self.job_name is None:
            raise ConfigError(f"{prefix}.num_consumers: coordinated reads share one job; set {prefix}.job_name too")
        return self

    @property
    def enabled(self) -> bool:
        return self.address is not None


class DataConfig(StrictModel):
    """One input pipeline: source → parse → preprocess → cache → shuffle → repeat → augment → batch."""

    source: Optional[SourceConfig] = pydantic.Field(None, discriminator="type")
    mixture: Optional[MixtureConfig] = pydantic.Field(
        None, description="several sources mixed at set rates, instead of source (docs/mixtures.md)")
    features: dict[str, FeatureConfig] = {}
    preprocess: list[OpConfig] = []
    augment: list[OpConfig] = []
    cache: CacheConfig = CacheConfig()
    shuffle: ShuffleConfig = ShuffleConfig()
    repeat: Union[pydantic.PositiveInt, Literal["forever"]] = 1
    batch_size: pydantic.PositiveInt = pydantic.Field(description="GLOBAL batch, split over replicas")
    drop_remainder: bool = True
    outputs: Optional[OutputsConfig] = None
    prefetch: Union[pydantic.NonNegativeInt, Literal["autotune"]] = AUTOTUNE
    seed: int = pydantic.Field(
        0, description="root of every random choice: the file order of each epoch (the same on every host, so "
        "file shards never overlap), record and window shuffles, and the per-element seeds of random ops; "
        "change it for a different draw. It does not fix the element order: see options.deterministic"
    )
    parse: Literal["auto", "per_example", "batched"] = pydantic.Field(
        "auto", description="batched: batch serialized records, then parse and run the ops on whole "
        "batches (needs every op batchable); auto: batched when possible and there is no cache"
    )
    num_parallel_calls: Union[pydantic.PositiveInt, Literal["autotune", "auto"]] = pydantic.Field(
        "auto", description="parallel calls of the preprocessing map; auto: the cores this process may use"
    )
    options: OptionsConfig = OptionsConfig()
    image_size: Optional[list[pydantic.PositiveInt]] = pydantic.Field(
        None, description="[height, width] of a converted image dataset (features 'image' and 'label'): fills "
        "preprocess with decode_image, resize, value_range to [0, 1] and an int32 label, and outputs with "
        "{inputs: image, targets: label}, as keras.utils.image_dataset_from_directory users expect"
    )
    channels: Literal[1, 3, 4] = pydantic.Field(3, description="with image_size: the decoded image's channels")
    on_error: Literal["raise", "skip"] = pydantic.Field(
        "raise", description="raise: the first bad record stops the run with one line naming file, record and "
        "fix; skip: every record is checked once before the first epoch (the result is cached per file "
        "contents), bad ones are left out, counted by kind and file, and logged once each"
    )
    service: ServiceConfig = ServiceConfig()
    sequence: Optional[SequenceConfig] = pydantic.Field(
        None, description="variable-length token features into static [batch, length] tensors: pad, bucket or "
        "pack (docs/sequences.md); needed for features of kind ragged or sequence"
    )
    max_skipped: Union[pydantic.NonNegativeInt, pydantic.confloat(ge=0.0, lt=1.0)] = pydantic.Field(
        0.01, description="with on_error: skip, the most records that may be left out: a count (an int) or a "
        "fraction of all records (a float below 1); more is an error"
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _image_size_shorthand(cls, data: Any, info: pydantic.ValidationInfo) -> Any:
        """`image_size: [h, w]` → the preprocess ops and outputs it stands for (ordinary ops from then on)."""
        if not isinstance(data, dict) or data.get("image_size") is None:
            return data
        prefix = (info.context or {}).get("prefix", "data")
        size = data["image_size"]
        if not (isinstance(size, list) and len(size) == 2):
            raise ConfigError(f"{prefix}.image_size: give [height, width], e.g. [224, 224]; got {size!r}")
        expanded = [
            {"op": "decode_image", "key": "image", "channels": data.get("channels", 3)},
            {"op": "resize", "key": "image", "size": size},
            {"op": "value_range", "key": "image", "min": 0.0, "max": 1.0},
            {"op": "cast", "key": "label", "dtype": "int32"},
        ]
        # A config validated once holds both (the doctor and `config` re-validate its dump): that is no conflict.
        if data.get("preprocess") and _normalized(data["preprocess"]) != _normalized(expanded):
            raise ConfigError(f"{prefix}.image_size fills {prefix}.preprocess itself (decode, resize, value range, "
                              f"int32 label); remove one of them (or put extra ops in {prefix}.augment)")
        data = dict(data)
        data["preprocess"] = expanded
        data.setdefault("outputs", {"inputs": "image", "targets": "label"})
        return data

    @pydantic.model_validator(mode="after")
    def _check_features(self, info: pydantic.ValidationInfo) -> "DataConfig":
        # Op names and arguments are checked by tpu_pipeline.ops.check_ops (config imports no ops).
        prefix = (info.context or {}).get("prefix", "data")
        if (self.source is None) == (self.mixture is None):
            raise ConfigError(f"{prefix}: give exactly one of {prefix}.source (one source) or {prefix}.mixture "
                              f"(several, at set rates){'; both are set' if self.source is not None else ''}")
        if self.mixture is not None:
            self._check_mixture(prefix)
        if isinstance(self.source, TFRecordSourceConfig) and not self.features and self.source.dir is None:
            raise ConfigError(
                f"{prefix}.features: a tfrecord source needs a feature spec, e.g. "
                "{image: {dtype: string}, label: {dtype: int64}} (or use source.dir, whose metadata.json holds it)"
            )
        if self.sequence is not None and self.sequence.mode == "bucket" and not self.drop_remainder:
            raise ConfigError(f"{prefix}.drop_remainder=false: bucket mode pads each bucket's last batches with "
                              "zero-mask examples instead; remove drop_remainder")
        if isinstance(self.source, TFDSSourceConfig) and self.features:
            raise ConfigError(
                f"{prefix}.features: a tfds source yields decoded features, there is nothing to parse; remove "
                f"{prefix}.features (select or rename features with {prefix}.source.features)"
            )
        return self

    def _check_mixture(self, prefix: str) -> None:
        """What a mixture cannot do yet, or needs, in one line each."""
        where = f"{prefix}.mixture"
        for index, entry in enumerate(self.mixture.sources):
            if entry.source.dir is None and not (entry.features or self.features):
                raise ConfigError(f"{where}.sources[{index}] ({entry.name}): its records need a feature spec: "
                                  f"give {prefix}.features, the source's own features, or source.dir")
        if self.cache.enabled:
            raise ConfigError(f"{prefix}.cache.enabled: a mixture positions each source on its own and caches "
                              "nothing; remove cache")
        if self.service.enabled:
            raise ConfigError(f"{prefix}.service with {prefix}.mixture is not supported yet; remove one of them")
        if self.repeat != "forever" and any(entry.exhausted == "repeat" for entry in self.mixture.sources):
            raise ConfigError(
                f"{prefix}.repeat={self.repeat}: a mixture's sources end their own way ({where}.sources[].exhausted); "
                f"set {prefix}.repeat=forever with exhausted: repeat, or give every source exhausted: stop or drop "
                "for a mixture that ends")
        if self.on_error == "skip":
            raise ConfigError(f"{prefix}.on_error=skip with {prefix}.mixture is not supported yet: check the sources "
                              "with `tpu-pipeline verify` and use on_error: raise")


def _normalized(ops: Any) -> Any:
    """Ops as `OpConfig` dumps ({op, args}), so the short and the long form compare equal; as given if invalid."""
    try:
        return [OpConfig.model_validate(op).model_dump() for op in ops]  # an OpConfig validates as itself
    except (pydantic.ValidationError, TypeError, ConfigError):
        return ops

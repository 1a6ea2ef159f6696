"""The `data` config section: one typed place for every knob of one input pipeline.

Like tensorflow_datasets' ReadConfig, a single small model holds the read, preprocess, batching
and tf.data option knobs; unlike big_vision, an unknown key is an error, never ignored.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

import pydantic

from tpu_pipeline.config.base import StrictModel
from tpu_pipeline.config.sequence import SequenceConfig
from tpu_pipeline.config.tasks import predicts_tokens
from tpu_pipeline.errors import ConfigError

AUTOTUNE = "autotune"
IntOrAutotune = Union[pydantic.PositiveInt, Literal["autotune"]]


REMOVED_KEYS = {
    "file_seed": "data.seed (the root of every random choice, file order included)",
    "seed": "data.seed (the root of every random choice; data.options.deterministic=true for a repeatable order)",
}


def _refuse_removed(value: Any, where: str, keys: tuple[str, ...]) -> Any:
    """A key this version replaced: one line naming its replacement, not a bare 'unknown key'."""
    if isinstance(value, dict):
        for name in keys:
            if name in value:
                raise ConfigError(f"{where}.{name} was removed; use {REMOVED_KEYS[name]}")
    return value


class TFRecordSourceConfig(StrictModel):
    """TFRecord files by glob (local or any tf.io.gfile scheme such as gs://), or a converted dataset dir."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        return _refuse_removed(value, f"{(info.context or {}).get('prefix', 'data')}.source", ("file_seed",))

    type: Literal["tfrecord"] = "tfrecord"
    files: Union[str, list[str], None] = pydantic.Field(
        None, description="glob pattern(s), comma-separated or a list; e.g. gs://bucket/train-*.tfrecord"
    )
    dir: Optional[str] = pydantic.Field(
        None, description="a directory written by `tpu-pipeline convert`: files, features, counts from its metadata.json"
    )
    split: Optional[str] = pydantic.Field(None, description="with dir: which split to read (default train)")
    compression: Literal["", "GZIP", "ZLIB"] = ""
    shuffle_files: bool = True
    sharding: Literal["auto", "balanced", "file", "element", "off"] = pydantic.Field(
        "auto", description="auto = balanced: each input pipeline reads an equal run of each epoch's records "
        "(counts from metadata.json, or counted once); file: whole files per pipeline (uneven); element: every "
        "pipeline reads everything and keeps every n-th element"
    )
    cycle_length: IntOrAutotune = 16
    block_length: pydantic.PositiveInt = 1
    num_parallel_calls: Union[pydantic.NonNegativeInt, Literal["autotune"]] = pydantic.Field(
        AUTOTUNE, description="parallel file readers; 0 reads in the consumer's thread"
    )
    deterministic: Optional[bool] = None
    buffer_size: Union[pydantic.NonNegativeInt, Literal["auto"]] = pydantic.Field(
        "auto", description="read buffer per file in bytes; auto: 8 MiB for remote files (gs://: large "
        "reads hide latency), 256 KiB for local ones (a big buffer only evicts records from cache)"
    )
    record_batch: Union[pydantic.NonNegativeInt, Literal["auto"]] = pydantic.Field(
        "auto", description="records per block moved through the interleave (0: single records); "
        "auto: 256 when the pipeline parses whole batches, else 0"
    )

    @pydantic.model_validator(mode="after")
    def _files_or_dir(self, info: pydantic.ValidationInfo) -> "TFRecordSourceConfig":
        prefix = f"{(info.context or {}).get('prefix', 'data')}.source"
        if (self.files is None) == (self.dir is None):
            raise ConfigError(
                f"{prefix}: give exactly one of files (a glob of TFRecord files) or dir (a directory written by "
                f"`tpu-pipeline convert`){'; both are set' if self.files is not None else ''}"
            )
        if self.split is not None and self.dir is None:
            raise ConfigError(f"{prefix}.split: only with {prefix}.dir (with files, the glob chooses the split)")
        return self


class TFDSSourceConfig(StrictModel):
    """A TensorFlow Datasets dataset prepared in data_dir, read with tfds.ReadConfig per input pipeline."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        return _refuse_removed(value, f"{(info.context or {}).get('prefix', 'data')}.source", ("file_seed",))

    type: Literal["tfds"] = "tfds"
    name: str = pydantic.Field(description="TFDS name, e.g. mnist, mnist:3.0.1, imagenet2012/subset")
    data_dir: Optional[str] = None
    split: str = pydantic.Field("train", description="a TFDS split spec, e.g. train, train[:90%], test")
    as_supervised: bool = pydantic.Field(False, description="keep only the two supervised features, by their names")
    features: Optional[dict[str, str]] = pydantic.Field(
        None, description="output name → TFDS feature path ('objects/label'): selects and renames features"
    )
    skip_decoding: list[str] = pydantic.Field(
        [], description="features (images) to keep as encoded bytes, for the fused decode-and-crop ops"
    )
    shuffle_files: bool = True
    sharding: Literal["auto", "file", "element", "off"] = "auto"
    interleave_cycle_length: IntOrAutotune = 16
    interleave_block_length: pydantic.PositiveInt = 1

    @pydantic.model_validator(mode="after")
    def _one_selection(self, info: pydantic.ValidationInfo) -> "TFDSSourceConfig":
        prefix = f"{(info.context or {}).get('prefix', 'data')}.source"
        if self.as_supervised and self.features:
            raise ConfigError(
                f"{prefix}: as_supervised and features both choose the features; use one "
                "(features can also rename, e.g. {image: image, label: label})"
            )
        return self


class ArraySourceConfig(StrictModel):
    """In-memory arrays (from_tensor_slices), from a .npz file in YAML or from Python directly."""

    type: Literal["arrays"] = "arrays"
    path: str = pydantic.Field(description=".npz file whose arrays become features (same first dim)")
    sharding: Literal["auto", "balanced", "element", "off"] = "auto"


SourceConfig = Union[TFRecordSourceConfig, ArraySourceConfig, TFDSSourceConfig]


SEQUENCE_KINDS = ("ragged", "sequence")  # kinds parsed as a variable-length sequence per example


class FeatureConfig(StrictModel):
    """One tf.Example feature: FixedLenFeature ('fixed'), VarLenFeature densified ('var'), a variable-length
    1-D vector ('ragged'), or a SequenceExample feature list ('sequence')."""

    dtype: Literal["string", "int64", "float32"]
    shape: list[pydantic.NonNegativeInt] = []
    kind: Literal["fixed", "var", "ragged", "sequence"] = pydantic.Field(
        "fixed", description="fixed: exactly `shape` values; var: any count, densified and padded with `default`; "
        "ragged: any count, kept as a 1-D tensor of the example's length (token ids; shape must be []); "
        "sequence: a tf.SequenceExample feature list, [steps, *shape] per example (any feature of kind sequence "
        "makes every record a SequenceExample, whose context holds the other features)"
    )
    default: Any = pydantic.Field(
        None, description="fixed: the value of an absent feature; var: the padding value; ragged and sequence: "
        "only [] (an absent feature is an empty sequence, not a fault)"
    )
    cast: Optional[Literal["int32", "int64"]] = pydantic.Field(
        None, description="ragged and sequence int64 features: the dtype they arrive as; unset: int32 (what TPUs "
        "take, half the bytes; an id outside int32 is an error, never wrapped); int64: as stored"
    )

    @pydantic.model_validator(mode="after")
    def _sequence_rules(self) -> "FeatureConfig":
        if self.kind == "ragged" and self.shape:
            raise ValueError(f"kind ragged is one 1-D vector of any length per example, so shape must be [] "
                             f"(given {self.shape}); use kind var or fixed for other shapes")
        if self.kind in SEQUENCE_KINDS and self.default not in (None, []):
            raise ValueError(f"kind {self.kind} takes only default: [] (an absent feature is then an empty "
                             f"sequence), given {self.default!r}; append or prepend ids with ops")
        if self.cast is not None and (self.kind not in SEQUENCE_KINDS or self.dtype != "int64"):
            raise ValueError(f"cast applies to int64 features of kind ragged or sequence (this one is {self.dtype}, "
                             f"kind {self.kind}); cast others with the op cast")
        return self

    @property
    def parsed_dtype(self) -> str:
        """The dtype the parsed feature has: `dtype`, but int32 for int64 ragged and sequence features
        unless `cast: int64`."""
        if self.kind in SEQUENCE_KINDS and self.dtype == "int64":
            return self.cast or "int32"
        return self.dtype


class OpConfig(StrictModel):
    """One preprocessing op by registry name, with its keyword arguments."""

    op: str
    args: dict[str, Any] = {}

    @pydantic.model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        # Accept "random_flip" and {op: resize, size: 224} as well as {op:..., args: {...}}.
        if isinstance(value, str):
            return {"op": value}
        if isinstance(value, dict) and "op" in value and "args" not in value:
            return {"op": value["op"], "args": {k: v for k, v in value.items() if k != "op"}}
        return value


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


# What each data.sequence mode adds beside a key (pipeline/sequence_stages.py makes them; model/transformer.py
# reads them by these names).
SEQUENCE_INPUTS = {"pack": ("_segment_ids", "_positions"), "pad": ("_mask",), "bucket": ("_mask",)}
EXAMPLE_MASK = "example_mask"  # bucket mode: 0 on the examples that fill a bucket's last batches


def derived_outputs(sequence: Optional[SequenceConfig], task: str) -> Optional[OutputsConfig]:
    """The outputs a language model takes from a data.sequence pipeline, when the config gives none.

    The target key is `targets` (what {op: lm_shift} writes), else the last of sequence.keys; every
    other key is an input, with what its mode adds: pack → its segment ids and positions; pad and
    bucket → its mask. The weights leave padding out: the targets' segment ids (pack) or mask (pad),
    and in bucket mode also `example_mask` (the filler examples of a bucket's last batches). None for
    a classifier (its label is the user's to name) or a single key (nothing to predict it from)."""
    if sequence is None or not predicts_tokens(task) or len(sequence.keys) < 2:
        return None
    target = "targets" if "targets" in sequence.keys else sequence.keys[-1]
    suffixes = SEQUENCE_INPUTS[sequence.mode]
    inputs = [name for key in sequence.keys if key != target for name in (key, *(key + s for s in suffixes))]
    weights: list[str] = [target + suffixes[0]]
    if sequence.mode == "bucket":
        weights.insert(0, EXAMPLE_MASK)
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

    source: SourceConfig = pydantic.Field(discriminator="type")
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
        if data.get("preprocess"):
            raise ConfigError(f"{prefix}.image_size fills {prefix}.preprocess itself (decode, resize, value range, "
                              f"int32 label); remove one of them (or put extra ops in {prefix}.augment)")
        data = dict(data)
        data["preprocess"] = [
            {"op": "decode_image", "key": "image", "channels": data.get("channels", 3)},
            {"op": "resize", "key": "image", "size": size},
            {"op": "value_range", "key": "image", "min": 0.0, "max": 1.0},
            {"op": "cast", "key": "label", "dtype": "int32"},
        ]
        data.setdefault("outputs", {"inputs": "image", "targets": "label"})
        return data

    @pydantic.model_validator(mode="after")
    def _check_features(self, info: pydantic.ValidationInfo) -> "DataConfig":
        # Op names and arguments are checked by tpu_pipeline.ops.check_ops (config imports no ops).
        prefix = (info.context or {}).get("prefix", "data")
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

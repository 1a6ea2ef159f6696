"""The `data.source` section: where records come from (TFRecord files or a converted dir, TFDS, arrays)."""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

import pydantic

from tpu_pipeline.config.base import StrictModel
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
        if self.files is not None and self.dir is not None:
            # Set in one layer (a file, or two overrides together): an override of one over a file's other
            # replaces it (`loader.SOURCE_KINDS`), so only this is left to refuse, with what to type.
            split = f" {prefix}.split=null" if self.split is not None else ""
            raise ConfigError(
                f"{prefix}: give exactly one of files (a glob of TFRecord files) or dir (a directory written by "
                f"`tpu-pipeline convert`); both are set: to read the files, end the overrides with {prefix}.dir=null{split}; "
                f"to read the directory, with {prefix}.files=null"
            )
        if self.files is None and self.dir is None:
            raise ConfigError(
                f"{prefix}: give exactly one of files (a glob of TFRecord files) or dir (a directory written by "
                f"`tpu-pipeline convert`), e.g. {prefix}.files=gs://bucket/train-*.tfrecord"
            )
        if not _patterns(self.files) and self.dir is None:
            raise ConfigError(
                f"{prefix}.files is empty ({self.files!r}): there is nothing to read; give a glob of TFRecord files, "
                f"e.g. {prefix}.files=gs://bucket/train-*.tfrecord, or a converted dataset with {prefix}.dir=DIR"
            )
        if self.split is not None and self.dir is None:
            raise ConfigError(f"{prefix}.split: only with {prefix}.dir (with files, the glob chooses the split); "
                              f"remove it: {prefix}.split=null")
        return self


def _patterns(files: Union[str, list[str], None]) -> list[str]:
    """The non-blank globs of data.source.files (comma-separated or a list), as the source lists them."""
    if files is None:
        return []
    parts = files.split(",") if isinstance(files, str) else files
    return [part for part in parts if str(part).strip()]


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

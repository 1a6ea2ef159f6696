"""The feature spec checked against a real record before anything runs.

A wrong feature name, dtype or shape otherwise surfaces as a runtime trace from inside
`parse_example`, deep in tf.data and after the model is built (on a TPU, after minutes of
compilation). One record of the source's first file is read eagerly (a few KB) and compared key by
key in Python (`format.example_check`, which `verify` uses on every record), so the error names
the file, the key and the fix.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence, Optional

import tensorflow as tf

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.example_check import misfit
from tpu_pipeline.format.sniff import file_hint
from tpu_pipeline.pipeline.sources.base import RecordFileSource


def first_record(path: str, compression: str = "") -> Optional[bytes]:
    """The file's first serialized record, None when it has none; a DataError naming the file if unreadable."""
    with tf.init_scope():
        try:
            for record in tf.data.TFRecordDataset(path, compression_type=compression).take(1):
                return bytes(record.numpy())
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
            hint = file_hint(path)
            if hint is not None:
                raise DataError(f"{path}: {hint}") from None
            first_line = (str(error).splitlines() or [""])[0]
            raise DataError(f"{path}: the first record cannot be read ({type(error).__name__}: {first_line}); the "
                            "file is damaged or not a TFRecord file (check data.source.compression; "
                            "tpu-pipeline verify lists every damaged record)") from None
    return None


def check_features(path: str, record: bytes, features: Mapping[str, Any], prefix: str = "data") -> None:
    """Raises a one-line error when `record` (the first of `path`) does not fit the feature spec."""
    found = misfit(record, features)
    if found is None:
        return
    if found.key is None:
        raise DataError(f"{path}: record 0 is {found.what}, which {prefix}.features describes; {found.fix}")
    raise ConfigError(f"{prefix}.features.{found.key}: record 0 of {path} {found.what}; {found.fix}")


def check_first_record(source: RecordFileSource, features: Any, prefix: str, per_source: Sequence[Any] = (),
                       found: Sequence[Optional[tuple[str, Optional[bytes]]]] = ()) -> None:
    """The feature spec against the first record found in the first few files (build time, not a trace
    later): of each source, for a mixture, with its own spec where the plan parses each source apart
    (`per_source`). `found`: per source, a file that holds a record and that record where it was read
    (`empty_check.first_records`), so no file is opened twice."""
    parts = source.record_sources()
    for index, (part, spec) in enumerate(zip(parts, per_source or [features] * len(parts))):
        hit = found[index] if index < len(found) else None
        if hit is not None:
            path, record = hit
            record = record if record is not None else first_record(path, getattr(part, "compression", ""))
            if record is not None:
                check_features(path, record, spec, prefix)
            continue
        for path in part.tfrecord_files()[:3]:
            record = first_record(path, getattr(part, "compression", ""))
            if record is not None:
                check_features(path, record, spec, prefix)
                break

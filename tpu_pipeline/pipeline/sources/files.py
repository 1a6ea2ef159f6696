"""The TFRecord files a source reads: globs expanded to a checked list, sizes checked against
metadata.json, and records counted (once per process) where no metadata.json lists them.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import threading
from typing import Sequence, Union

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import DataError
from tpu_pipeline.system import local_path


def lists_no_file(label: str, given: Union[str, Sequence[str]], after: str = "") -> str:
    """The one line for a files setting that names no file (here and the pipeline's empty check)."""
    shown = given if isinstance(given, str) else ", ".join(given)
    return f"{label}: {shown!r} lists no file, so there is nothing to read; give TFRecord files that hold records{after}"


def list_files(patterns: Union[str, Sequence[str]]) -> list[str]:
    """Expands globs (comma-separated or a list; local or gs://) to a sorted, de-duplicated file list."""
    given = patterns
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    if not patterns:  # the pipeline's empty check says the same; this guard keeps it one line if that one breaks
        raise DataError(lists_no_file("data.source.files", given))
    files: list[str] = []
    for pattern in patterns:
        pattern = local_path(pattern)
        matched = tf.io.gfile.glob(pattern)
        if not matched:
            raise DataError(
                f"data.source.files: pattern {pattern!r} matches no file; check the path "
                "(and that gs:// credentials are set up on this machine)"
            )
        files.extend(_readable_files(pattern, matched))
    return sorted(set(files))


def _readable_files(pattern: str, matched: list[str]) -> list[str]:
    """The matches, or a one-line error for one that cannot be read as a file (TF's own error would
    come later, from inside the pipeline, without the path)."""
    for path in matched:
        if "://" not in path and os.path.islink(path) and not os.path.exists(path):
            raise DataError(f"data.source.files: {path!r} (from {pattern!r}) is a symbolic link to "
                            f"{os.readlink(path)!r}, which does not exist; fix or remove the link, or narrow the pattern")
        if tf.io.gfile.isdir(path):
            raise DataError(f"data.source.files: {pattern!r} matches the directory {path!r}; match files only "
                            f"(e.g. {tf.io.gfile.join(path, '*.tfrecord')!r}), or use data.source.dir for a converted dataset")
    return matched


def check_sizes(files: Sequence[str], counts: Sequence[int], origin: str) -> None:
    """A file far too small for the records `origin` (metadata.json) lists is an error now, not a
    short epoch later: every TFRecord takes at least 16 bytes of framing. One stat per file, in parallel."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        sizes = list(pool.map(lambda path: int(tf.io.gfile.stat(path).length), files))
    for path, size, count in zip(files, sizes, counts):
        if size < 16 * count:
            what = "is empty (0 bytes)" if size == 0 else f"has {size:,} bytes, too few for them"
            raise DataError(f"{path}: {origin} lists {count} record(s) in this file, but it {what}; the file is damaged "
                            "or was replaced: write the dataset again (tpu-pipeline convert), or restore the file")


_COUNTS: dict[tuple[str, str, int, int], int] = {}
_COUNTS_LOCK = threading.Lock()


def count_records(files: Sequence[str], compression: str = "") -> list[int]:
    """Records per file, by one fast pass (framing and CRC, no parse), remembered per process by
    (path, size, mtime): a bare glob has no metadata.json to tell them."""
    keys = []
    for path in files:
        stat = tf.io.gfile.stat(path)
        keys.append((path, compression, int(stat.length), int(stat.mtime_nsec)))
    with _COUNTS_LOCK, tf.init_scope():  # eagerly, even when a pipeline builds an epoch inside a function
        missing = [key for key in keys if key not in _COUNTS]
        if missing:
            logging.info("counting the records of %d file(s) once (a converted dataset's metadata.json has them)",
                         len(missing))
            paths = tf.data.Dataset.from_tensor_slices([key[0] for key in missing])
            counted = paths.map(
                lambda path: tf.data.TFRecordDataset(path, compression_type=compression).reduce(
                    tf.constant(0, tf.int64), lambda count, _: count + 1),
                num_parallel_calls=8, deterministic=True)
            try:
                for key, count in zip(missing, counted.as_numpy_iterator()):
                    _COUNTS[key] = int(count)
            except tf.errors.DataLossError:
                _name_damaged_file([key[0] for key in missing], compression)
                raise
        return [_COUNTS[key] for key in keys]


def _name_damaged_file(files: Sequence[str], compression: str) -> None:
    """Counting failed somewhere in `files` (TF's error names no file): find the file, one by one."""
    for path in files:
        try:
            tf.data.TFRecordDataset(path, compression_type=compression).reduce(0, lambda count, _: count + 1)
        except tf.errors.DataLossError as error:
            found = re.search(r"(corrupted|truncated) record at \d+", str(error))
            what = found.group(0) if found else "unreadable"
            raise DataError(f"{path}: {what} (bytes that are not TFRecord framing: a damaged or truncated file); copy "
                            "or convert it again; tpu-pipeline verify lists every damaged record") from None

"""Naming the file and record behind TensorFlow's anonymous data errors: one line, whoever reads the data.

With `data.on_error: raise`, a damaged record reaches TF's reader or ops at run time, and TF says
`jpeg::Uncompress failed ... [[{{node DecodeJpeg}}]]`, `corrupted record at 1234` or, for a token id
past the vocabulary, `indices[3,7] = 300 is not in [0, 259)`: no file, no record. The fast path
stays as it is; the error path pays for the diagnosis: on one of `DATA_ERRORS`
the source's files are scanned in parallel with `verify`'s checks (`record_check.FileChecker`),
stopping at the first fault, and the error becomes one `DataError` line naming the file, the
record and the fix. When the scan finds nothing (the error was not the data's, or the source is
not TFRecord files) the original error goes on unchanged.

One implementation serves every reader: `Pipeline.iterator` / `distributed_iterator`,
`Pipeline.naming_data_errors()` around a user's own loop or `model.fit`, `train` (around `fit` and
`evaluate`), and `verify` (whose file list and checker are `checked_files`).
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import Any, Optional

import tensorflow as tf

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import DataError, TpuPipelineError
from tpu_pipeline.format.vocabulary import Vocabulary
from tpu_pipeline.pipeline.checks.record_check import Fault, FileChecker, tf_message
from tpu_pipeline.pipeline.checks.vocabularies import dataset_vocabularies
from tpu_pipeline.pipeline.plan import make_plan
from tpu_pipeline.pipeline.source_factory import source_from_config
from tpu_pipeline.pipeline.sources.base import RecordFileSource, Source

# What TF raises at run time for data it cannot read, parse or decode (a short file fails
# assert_cardinality: FailedPrecondition); OutOfRangeError is the end, not a fault.
DATA_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError)


def checked_files(config: DataConfig, prefix: str = "data", num_classes: Optional[int] = None,
                  source: Optional[Source] = None, vocab: Optional[Vocabulary] = None
                  ) -> tuple[FileChecker, list[str], str, list[Optional[int]]]:
    """(the checker, the files, their compression, records per file where metadata.json lists them)
    of `source` (default: the config's own); a DataError when it is not TFRecord files. `vocab`: the
    whole config's token vocabulary (`vocabularies.config_vocabulary`), for files whose dataset has none."""
    if source is None:
        source = source_from_config(config, prefix)
    if not isinstance(source, RecordFileSource):
        raise DataError(f"{prefix}.source: verify reads TFRecord files (type: tfrecord, files or dir); "
                        f"a {type(source).__name__} has nothing to scan")
    plan = make_plan(config, source, prefix)
    files_source = source.files_source()
    if num_classes is None:
        num_classes = source.info().num_classes  # a converted dataset's class names
    files = files_source.tfrecord_files()
    checker = FileChecker(config, prefix, plan.features.value or {}, num_classes, vocab, dataset_vocabularies(files))
    return checker, files, files_source.compression, files_source.listed_counts()


def first_fault(config: DataConfig, prefix: str = "data", num_classes: Optional[int] = None,
                budget_seconds: float = 120.0, workers: Optional[int] = None,
                source: Optional[Source] = None, vocab: Optional[Vocabulary] = None) -> Optional[Fault]:
    """A fault of the source, found by scanning its files in parallel for at most `budget_seconds`
    (the earliest file's, among those found); None when none was found in time. For turning a bare
    TF error into a line that names the file and record."""
    checker, files, compression, expected = checked_files(config, prefix, num_classes, source, vocab)
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2)
    futures = [pool.submit(checker.check_file, path, compression, count, first_only=True, stop=stop)
               for path, count in zip(files, expected)]
    found: dict[int, Fault] = {}
    try:
        for future in concurrent.futures.as_completed(futures, timeout=budget_seconds):
            faults = future.result()[1]
            if faults:
                found[futures.index(future)] = faults[0]
                stop.set()  # one is enough; the others finish their current record
    except concurrent.futures.TimeoutError:
        pass
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)
    return found[min(found)] if found else None


def named_data_error(error: BaseException, config: DataConfig, prefix: str = "data",
                     num_classes: Optional[int] = None, source: Optional[Source] = None,
                     vocab: Optional[Vocabulary] = None) -> Optional[DataError]:
    """The one-line DataError for TF's `error`: the first fault of the source (file, record, what is
    wrong, the fix), what TF said, and how to list every fault; None when the scan finds no fault
    or cannot scan this source."""
    try:
        fault = first_fault(config, prefix, num_classes, source=source, vocab=vocab)
    except TpuPipelineError:
        return None
    if fault is None:
        return None
    return DataError(f"{prefix}: {fault.line()} (TensorFlow said: {tf_message(error)}); "
                     "list every fault with: tpu-pipeline verify --config ...")


class NamingDataErrors:
    """Context manager: TF's data errors raised inside become the one-line DataError naming the
    file and record (`raise ... from None`); every other exception, and a data error whose fault
    the scan does not find, passes unchanged. `config=None`: nothing to scan, nothing changes."""

    def __init__(self, config: Optional[DataConfig], prefix: str = "data", num_classes: Optional[int] = None,
                 source: Optional[Source] = None, vocab: Optional[Vocabulary] = None) -> None:
        self._config, self._prefix, self._num_classes, self._source = config, prefix, num_classes, source
        self._vocab = vocab

    def __enter__(self) -> "NamingDataErrors":
        return self

    def __exit__(self, kind: Any, error: Optional[BaseException], traceback: Any) -> bool:
        if error is None or self._config is None or not isinstance(error, DATA_ERRORS):
            return False
        named = named_data_error(error, self._config, self._prefix, self._num_classes, self._source, self._vocab)
        if named is None:
            return False  # the original error goes on
        # TF's error stays the context (not shown), without its frames: they hold the failed iterators
        # (prefetch threads, device buffers) alive for as long as the DataError lives.
        error.with_traceback(None)
        raise named from None

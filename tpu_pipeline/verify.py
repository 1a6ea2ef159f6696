"""`verify`: read every record of a config's source once, before paying for a TPU, and list every fault.

The files come from the config's source (a glob or a converted dataset's metadata.json, with its
record counts and class names); each file is checked by `pipeline.record_check.FileChecker`, in parallel
(one thread per file, up to the host's cores: TF ops and CRCs release the GIL).
"""
from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from typing import Optional

from tqdm import tqdm

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.errors import DataError
from tpu_pipeline.pipeline.builder import source_from_config
from tpu_pipeline.pipeline.plan import make_plan
from tpu_pipeline.pipeline.source import RecordFileSource
from tpu_pipeline.pipeline.record_check import Fault, FileChecker, Report


def _checked_files(config: DataConfig, prefix: str, num_classes: Optional[int]
                   ) -> tuple[FileChecker, list[str], str, list[Optional[int]]]:
    """(the checker, the files, their compression, records per file where metadata.json lists them)."""
    source = source_from_config(config)
    if not isinstance(source, RecordFileSource):
        raise DataError(f"{prefix}.source: verify reads TFRecord files (type: tfrecord, files or dir); "
                        f"a {type(source).__name__} has nothing to scan")
    plan = make_plan(config, source, prefix)
    files_source = source.files_source()
    if num_classes is None:
        num_classes = source.info().num_classes  # a converted dataset's class names
    checker = FileChecker(config, prefix, plan.features.value or {}, num_classes)
    return checker, files_source.tfrecord_files(), files_source.compression, files_source.listed_counts()


def verify_data(config: DataConfig, prefix: str = "data", num_classes: Optional[int] = None,
                progress: bool = True, workers: Optional[int] = None) -> Report:
    """Checks every record of `config`'s TFRecord source; returns the faults (it raises only for a
    config that cannot be checked at all)."""
    checker, files, compression, expected = _checked_files(config, prefix, num_classes)
    report = Report(prefix, files=len(files))
    total = sum(c for c in expected if c is not None) or None
    lock = threading.Lock()
    with tqdm(total=total, desc=f"verify {prefix}", unit=" records", disable=not progress, file=sys.stderr,
              mininterval=0.5, dynamic_ncols=True) as bar:
        def tick(count: int) -> None:
            with lock:
                bar.update(count)

        with concurrent.futures.ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
            results = list(pool.map(lambda args: checker.check_file(args[0], compression, args[1], tick), zip(files, expected)))
    for framed, faults in results:
        report.records += framed
        report.faults.extend(faults)
    return report


def first_fault(config: DataConfig, prefix: str = "data", num_classes: Optional[int] = None,
                budget_seconds: float = 120.0, workers: Optional[int] = None) -> Optional[Fault]:
    """A fault of the source, found by scanning its files in parallel for at most `budget_seconds`
    (the earliest file's, among those found); None when none was found in time. For turning a bare
    TF error into a line that names the file and record."""
    checker, files, compression, expected = _checked_files(config, prefix, num_classes)
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

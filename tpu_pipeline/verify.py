"""`verify`: read every record of a config's source once, before paying for a TPU, and list every fault.

The files come from the config's source (a glob or a converted dataset's metadata.json, with its
record counts and class names); each file is checked by `pipeline.checks.record_check.FileChecker`, in parallel
(one thread per file, up to the host's cores: TF ops and CRCs release the GIL). Token ids are checked
against each file's dataset's tokenizer (metadata.json), else the vocabulary `vocab` of the whole config
(`checks.vocabularies.config_vocabulary`); the report says once which, or that none is known.
"""
from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from typing import Optional

from tqdm import tqdm

from tpu_pipeline.config.data import DataConfig
from tpu_pipeline.format.vocabulary import Vocabulary
from tpu_pipeline.pipeline.checks.record_check import Report
from tpu_pipeline.pipeline.checks.vocabularies import config_vocabulary
from tpu_pipeline.pipeline.data_errors import checked_files, first_fault

# first_fault lives in pipeline.data_errors (every reader names faults), config_vocabulary in checks.vocabularies
__all__ = ["config_vocabulary", "first_fault", "verify_data"]


def verify_data(config: DataConfig, prefix: str = "data", num_classes: Optional[int] = None,
                progress: bool = True, workers: Optional[int] = None, vocab: Optional[Vocabulary] = None) -> Report:
    """Checks every record of `config`'s TFRecord source; returns the faults (it raises only for a
    config that cannot be checked at all)."""
    checker, files, compression, expected = checked_files(config, prefix, num_classes, vocab=vocab)
    notes = [checker.vocabulary_note(files), checker.chat_note(files)]
    report = Report(prefix, files=len(files), notes=[note for note in notes if note])
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

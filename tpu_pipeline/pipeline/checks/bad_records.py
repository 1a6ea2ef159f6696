"""`data.on_error: skip`: every record checked once, and only the damaged files rewritten without their bad records.

tf.data's `ignore_errors` drops elements but counts nothing, loses a whole batch for one bad
record in batch-then-parse mode, and cannot read past a bad CRC. So skipping happens before the
pipeline instead: the files are checked once with `verify`'s checks (framing, CRCs, the feature
spec, labels, token ids against their vocabulary and empty documents, the deterministic ops), the
result is cached per file contents (path, size, mtime) and config, and each damaged file is replaced
by a copy holding exactly its good records. The pipeline then reads clean files with exact counts, so:

- clean data costs nothing after the first check (the pipeline is the same as with `raise`);
- every bad record, or the unreadable rest of a file, is left out, counted by kind and file, and
  logged once; `data.max_skipped` is checked before the first epoch;
- a good record is never delivered twice, and positions (balanced sharding, exact resume) count
  good records, so a resume stays exact.

The copies live under `$TPU_PIPELINE_CACHE/verified/` (local to each host); the damaged originals
are never modified. `without_bad_records` gives `Pipeline.from_config` the source over them.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
from typing import Any, Mapping, Optional, Sequence

import tensorflow as tf
from absl import logging

from tpu_pipeline.config.data import DataConfig, service_host_port
from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.format.vocabulary import Vocabulary
from tpu_pipeline.pipeline.checks.record_check import TAIL_KINDS, Fault, FileChecker, count_by_kind
from tpu_pipeline.pipeline.checks.record_scan import Record, scan_records
from tpu_pipeline.pipeline.checks.vocabularies import dataset_vocabularies
from tpu_pipeline.pipeline.sources.base import RecordFileSource
from tpu_pipeline.pipeline.sources.dataset_dir import DatasetDirSource
from tpu_pipeline.pipeline.sources.tfrecord import TFRecordSource
from tpu_pipeline.system import available_cores, default_cache_dir

VERSION = 3  # 2: token features checked (vocabulary, empty documents); 3: chat loss masks (checks/chat_check.py)
LOGGED_FAULTS = 20  # each fault is logged once, up to this many lines; the rest are counted


@dataclasses.dataclass(frozen=True)
class FileResult:
    path: str
    read_from: str  # the original, or its repaired copy
    good: int
    skipped: int  # records left out: bad ones, plus a lost tail's records where metadata.json tells
    faults: tuple[Fault, ...]


@dataclasses.dataclass(frozen=True)
class SkipReport:
    """What `on_error: skip` left out of one source (`Pipeline.skipped`, and `skipped` in metrics.json)."""

    section: str
    files: tuple[FileResult, ...]

    @property
    def skipped(self) -> int:
        return sum(f.skipped for f in self.files)

    @property
    def total(self) -> int:
        return sum(f.good + f.skipped for f in self.files)

    @property
    def faults(self) -> list[Fault]:
        return [fault for f in self.files for fault in f.faults]

    def by_kind(self) -> dict[str, int]:
        return count_by_kind(self.faults)

    def by_file(self) -> dict[str, int]:
        return {f.path: f.skipped for f in self.files if f.skipped}

    def as_dict(self) -> dict[str, Any]:
        return {"records": self.total, "skipped": self.skipped, "faults_by_kind": self.by_kind(),
                "skipped_by_file": self.by_file()}


def _skipped_in(framed: int, faults: Sequence[Fault], expected: Optional[int]) -> tuple[set[int], int]:
    """(indices of the bad records among the framed ones, records left out in all)."""
    bad = {f.record for f in faults if f.record is not None and f.kind not in TAIL_KINDS}
    lost = 0
    if expected is not None and expected > framed:
        lost = expected - framed  # a lost tail, or records missing from the file
    elif any(f.kind in TAIL_KINDS for f in faults):
        lost = 1  # the file's real length is unknown: at least the record that broke
    return bad, len(bad) + lost


def _repair(path: str, compression: str, bad: set[int], good: int, out_dir: str) -> str:
    """A copy of `path` with only its good records (written once, atomically)."""
    stat = tf.io.gfile.stat(path)
    name = hashlib.sha256(f"{path}|{stat.length}|{stat.mtime_nsec}|{sorted(bad)}".encode()).hexdigest()[:20]
    target = os.path.join(out_dir, f"{name}.tfrecord")
    if os.path.exists(target):
        return target
    os.makedirs(out_dir, exist_ok=True)
    temp = f"{target}.tmp-{os.getpid()}"
    written = 0
    with tf.io.TFRecordWriter(temp, options=compression or None) as writer:
        for item in scan_records(path, compression):
            if isinstance(item, Record) and item.index not in bad:
                writer.write(item.data)
                written += 1
    if written != good:
        os.remove(temp)
        raise DataError(f"{path}: changed while it was being checked ({written} good records now, {good} before); "
                        "start again once nothing writes it")
    os.replace(temp, target)
    return target


def _check_file(checker: FileChecker, path: str, compression: str, expected: Optional[int], out_dir: str) -> FileResult:
    framed, faults = checker.check_file(path, compression, expected)
    bad, skipped = _skipped_in(framed, faults, expected)
    good = framed - len(bad)
    damaged = bool(bad) or any(f.kind in TAIL_KINDS for f in faults)
    read_from = _repair(path, compression, bad, good, out_dir) if damaged else path
    return FileResult(path, read_from, good, skipped, tuple(faults))


def _cache_key(config: DataConfig, files: Sequence[str], compression: str, features: Mapping[str, Any],
               num_classes: Optional[int], expected: Sequence[Optional[int]], checker: FileChecker) -> str:
    stamps = []
    for path in files:
        stat = tf.io.gfile.stat(path)
        stamps.append([path, int(stat.length), int(stat.mtime_nsec)])
    key = {"version": VERSION, "files": stamps, "compression": compression, "expected": list(expected),
           "features": {k: v.model_dump() for k, v in features.items()},
           "preprocess": [op.model_dump() for op in config.preprocess], "num_classes": num_classes,
           "vocab_sizes": [getattr(checker.vocabulary(path), "size", None) for path in files],
           "outputs": config.outputs.model_dump() if config.outputs is not None else None}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _load(path: str) -> Optional[tuple[FileResult, ...]]:
    try:
        with open(path) as handle:
            entries = json.load(handle)
        results = tuple(FileResult(e["path"], e["read_from"], e["good"], e["skipped"],
                                   tuple(Fault(**f) for f in e["faults"])) for e in entries)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return results if all(tf.io.gfile.exists(r.read_from) for r in results) else None


def _save(path: str, results: Sequence[FileResult]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w") as handle:
        json.dump([{**dataclasses.asdict(r), "faults": [dataclasses.asdict(f) for f in r.faults]} for r in results], handle)
    os.replace(temp, path)


def check_files(config: DataConfig, section: str, files: Sequence[str], compression: str,
                features: Mapping[str, Any], expected: Sequence[Optional[int]],
                num_classes: Optional[int] = None, vocab: Optional[Vocabulary] = None) -> SkipReport:
    """Every file checked once (or the cached result for the same contents and config). `vocab`: the
    whole config's token vocabulary, for files whose dataset's metadata.json has none."""
    root = os.path.join(default_cache_dir(), "verified")
    checker = FileChecker(config, section, dict(features), num_classes, vocab, dataset_vocabularies(files))
    key = _cache_key(config, files, compression, features, num_classes, expected, checker)
    cached = os.path.join(root, f"{key}.json")
    results = _load(cached)
    if results is None:
        logging.info("%s.on_error=skip: checking every record of %d file(s) once (cached in %s for these files and this "
                     "config)", section, len(files), cached)
        repaired = os.path.join(root, "repaired")
        with concurrent.futures.ThreadPoolExecutor(max_workers=available_cores()) as pool:
            results = tuple(pool.map(lambda args: _check_file(checker, args[0], compression, args[1], repaired),
                                     zip(files, expected)))
        _save(cached, results)
    report = SkipReport(section, results)
    _log(report)
    _check_limit(config, report)
    return report


def _log(report: SkipReport) -> None:
    faults = report.faults
    for fault in faults[:LOGGED_FAULTS]:
        logging.warning("%s.on_error=skip: leaving out %s", report.section, fault.line())
    if faults:
        kinds = ", ".join(f"{kind} {count}" for kind, count in report.by_kind().items())
        more = f" ({len(faults) - LOGGED_FAULTS} more not logged)" if len(faults) > LOGGED_FAULTS else ""
        logging.warning("%s.on_error=skip: %s of %s records left out in %d file(s): %s%s; tpu-pipeline verify lists "
                        "them all", report.section, f"{report.skipped:,}", f"{report.total:,}", len(report.by_file()),
                        kinds, more)


def _check_limit(config: DataConfig, report: SkipReport) -> None:
    limit = config.max_skipped
    allowed = int(limit * report.total) if isinstance(limit, float) else int(limit)
    if report.skipped > allowed:
        share = report.skipped / max(1, report.total)
        first = report.faults[0].line() if report.faults else ""
        raise DataError(f"{report.section}.max_skipped={limit}: {report.skipped} of {report.total} records are bad "
                        f"({share:.1%}), more than the {allowed} allowed; the first: {first}")


def without_bad_records(config: DataConfig, source: RecordFileSource, prefix: str,
                        num_classes: Optional[int], vocab: Optional[Vocabulary] = None
                        ) -> tuple[RecordFileSource, SkipReport]:
    """The source reading only good records (damaged files replaced by checked copies), and what was left out."""
    files_source = source.files_source()
    info = source.info()
    features = config.features or info.features
    report = check_files(config, prefix, files_source.tfrecord_files(), files_source.compression, features,
                         files_source.listed_counts(), num_classes or info.num_classes, vocab)
    clean = TFRecordSource(files=[r.read_from for r in report.files], compression=files_source.compression,
                           read=files_source.read, counts=[r.good for r in report.files], exact_files=True)
    if isinstance(source, DatasetDirSource):
        return dataclasses.replace(source, replaced=clean), report
    return clean, report


def check_copies_reachable(config: DataConfig, report: SkipReport, prefix: str) -> None:
    """With data.service on other machines, the checked copies of damaged files must be where those
    workers can read them: this host's disk is not."""
    if not config.service.enabled or service_host_port(config.service.address)[0] in ("localhost", "127.0.0.1", "[::1]"):
        return
    local = [r for r in report.files if r.read_from != r.path and "://" not in r.read_from]
    if local:
        raise ConfigError(
            f"{prefix}.on_error=skip wrote checked copies of {len(local)} damaged file(s) on this host (e.g. "
            f"{local[0].read_from}), which the tf.data service workers at {config.service.address} cannot read; "
            "set TPU_PIPELINE_CACHE to a shared path (gs://bucket/cache) or rewrite the files "
            "(`tpu-pipeline verify` lists them)"
        )

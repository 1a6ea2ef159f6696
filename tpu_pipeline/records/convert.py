"""Converts a source (image folder, CSV, NumPy, TFDS, text, Parquet, a save_to_disk folder) into TFRecord
shards plus metadata.json.

Safe output, step by step:
  0. `OUT/.convert.lock` is taken first (see out_lock.py): a second convert into the same --out
     refuses at once instead of interleaving its shards with ours; it is released in a `finally`;
  1. a plan (shard count and example ranges per split) goes to `OUT/_incomplete/plan.json`, keyed by
     a fingerprint of the input and of the options that change the output;
  2. each shard is written to `_incomplete/NAME.tmp-XXXX`, renamed to `_incomplete/NAME` once whole,
     then its record `NAME.json` (examples, bytes, skipped items) is written;
  3. when every shard is done they are renamed into OUT, a source's extra files (a tokenizer model)
     are written atomically, metadata.json is written last, and `_incomplete/` is removed.
An interrupted or failed run leaves no shard under its final name and no metadata.json (it is
written only after every shard is whole), so nothing looks complete. The same command run again
keeps the finished shards and writes the rest; other input or other options start over; a finished
dataset is left alone (or replaced with `--overwrite`).
"""
from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import sys
import uuid
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import tensorflow as tf
from absl import logging
from tqdm import tqdm

from tpu_pipeline.errors import ConfigError, DataError
from tpu_pipeline.records.convert_input import ConvertSource, Encoded, ItemError
from tpu_pipeline.records.out_lock import out_lock
from tpu_pipeline.records.parallel import ordered_map
from tpu_pipeline.records.sharding import num_shards_for, shard_bounds
from tpu_pipeline.records.shard_pause import pause_after_shard
from tpu_pipeline.format.metadata import METADATA_FILE, read_metadata, shard_name, write_metadata
from tpu_pipeline.system import available_cores, local_path

FORMAT_VERSION = 1
STATE_DIR = "_incomplete"
PLAN_FILE = "plan.json"
_SHARD_FILE = re.compile(r"^[A-Za-z0-9_]+-\d{5}-of-\d{5}\.tfrecord(\.gz|\.zz)?$")
COMPRESSIONS = ("", "GZIP", "ZLIB")


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """How to write: shard size, compression, error policy, parallelism. Named like the CLI flags."""

    target_shard_mb: float = 150.0  # the TFRecord guidance: shards of 100-200 MB
    min_shards: int = 8  # enough files for file-level sharding over up to 8 hosts
    compression: str = ""
    on_error: str = "raise"
    workers: int = 0  # 0 = every core this process may use
    overwrite: bool = False
    progress: bool = True

    def validate(self) -> None:
        if not self.target_shard_mb > 0:
            raise ConfigError(f"--target_shard_mb must be > 0 (given: {self.target_shard_mb})")
        if self.min_shards < 1:
            raise ConfigError(f"--min_shards must be >= 1 (given: {self.min_shards})")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(f"--compression must be one of none, GZIP, ZLIB (given: {self.compression!r})")
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"--on_error must be raise or skip (given: {self.on_error!r})")
        if self.workers < 0:
            raise ConfigError(f"--workers must be >= 0, 0 meaning one per core (given: {self.workers})")

    def num_workers(self) -> int:
        return self.workers or available_cores()


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    out_dir: str
    metadata: dict[str, Any]
    shards_written: int
    shards_reused: int
    already_complete: bool = False


def fingerprint(source: ConvertSource, options: ConvertOptions) -> str:
    """Hash of the input and the options the shards depend on (not workers, progress, on_error)."""
    key = {
        "format_version": FORMAT_VERSION,
        "source": source.identity(),
        "target_shard_mb": options.target_shard_mb,
        "min_shards": options.min_shards,
        "compression": options.compression,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]


def convert(source: ConvertSource, out_dir: str, options: ConvertOptions = ConvertOptions()) -> ConvertResult:
    """Writes (or finishes writing) `source` as shards + metadata.json under `out_dir`."""
    options.validate()
    if "://" not in out_dir:
        out_dir = local_path(out_dir, absolute=True)
    with out_lock(out_dir):  # before anything in out_dir is read or written; released however we leave
        return _convert_locked(source, out_dir, options)


def _convert_locked(source: ConvertSource, out_dir: str, options: ConvertOptions) -> ConvertResult:
    """The conversion proper, run while this process holds the lock. metadata.json is written only
    by `_finish`, after every shard is whole: an exception anywhere before it leaves none."""
    key = fingerprint(source, options)
    finished = _finished_dataset(out_dir, key, options)
    if finished is not None:
        return ConvertResult(out_dir, finished, 0, 0, already_complete=True)
    state = tf.io.gfile.join(out_dir, STATE_DIR)
    plan = _plan(source, out_dir, state, key, options)
    done = _done_shards(out_dir, state, plan)
    for temp in tf.io.gfile.glob(tf.io.gfile.join(state, "*.tmp-*")):  # left by a killed run
        tf.io.gfile.remove(temp)
    total = sum(end - start for entry in plan["splits"].values()
                for name, (start, end) in zip(entry["files"], entry["bounds"]) if name not in done)
    if done:
        logging.info("Resuming in %s: %d shard(s) already written.", out_dir, len(done))
    written = 0
    workers = min(options.num_workers(), getattr(source, "max_workers", None) or options.num_workers())
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="convert")
    unit = getattr(source, "unit", None) or (" documents" if source.kind == "text" else " examples")
    bar = tqdm(total=total, desc=f"convert {source.kind}", unit=unit, disable=not options.progress,
               file=sys.stderr, mininterval=0.5, dynamic_ncols=True)
    try:
        for split, entry in plan["splits"].items():
            written += _write_split(source, split, entry, state, done, options, executor, 8 * workers, bar)
    finally:
        bar.close()
        executor.shutdown(wait=True, cancel_futures=True)
    metadata = _finish(source, out_dir, state, plan, key, options)
    return ConvertResult(out_dir, metadata, written, len(done))


def interrupted_state(out_dir: str) -> str:
    """What an interrupted convert left in `out_dir`, in words: its finished shards (kept, and reused by
    the same command run again), or a finished dataset, or nothing."""
    if "://" not in out_dir:
        out_dir = local_path(out_dir, absolute=True)
    if read_metadata(out_dir) is not None:
        return f"{out_dir} holds the finished dataset (metadata.json): nothing is lost"
    state = tf.io.gfile.join(out_dir, STATE_DIR)
    plan_path = tf.io.gfile.join(state, PLAN_FILE)
    if not tf.io.gfile.exists(plan_path):
        return f"no shard was finished, nothing kept in {out_dir}; run the same command again to convert"
    plan = _read_json(plan_path)
    done = _done_shards(out_dir, state, plan)
    total = sum(len(entry["files"]) for entry in plan["splits"].values())
    return (f"{len(done)} of {total} shard(s) finished and kept in {state}; run the same command again to "
            "write the rest (no metadata.json yet, so nothing reads it as a dataset)")


def _finished_dataset(out_dir: str, key: str, options: ConvertOptions) -> Optional[dict[str, Any]]:
    """The metadata when `out_dir` already holds this very dataset; raises if it holds another."""
    existing = read_metadata(out_dir)
    if existing is None:
        return None
    if not options.overwrite:
        if existing.get("fingerprint") == key:
            _remove_tree(tf.io.gfile.join(out_dir, STATE_DIR))  # left if a run died after metadata.json
            logging.info("%s already holds this dataset; nothing to do.", out_dir)
            return existing
        raise DataError(
            f"--out {out_dir} already holds a finished dataset ({METADATA_FILE}) made from other input or "
            "other options; pass --overwrite to replace it, or choose another --out"
        )
    # Replace it: metadata.json goes first, so the directory never looks complete while it changes.
    tf.io.gfile.remove(tf.io.gfile.join(out_dir, METADATA_FILE))
    for split in (existing.get("splits") or {}).values():
        for name in split.get("files", []):
            _remove_file(tf.io.gfile.join(out_dir, name))
    for name in existing.get("extra_files") or []:  # e.g. a text dataset's tokenizer.model
        _remove_file(tf.io.gfile.join(out_dir, name))
    return None


def _plan(source: ConvertSource, out_dir: str, state: str, key: str, options: ConvertOptions) -> dict[str, Any]:
    """The plan of an unfinished run of the same conversion, or a new one (clearing leftovers)."""
    plan_path = tf.io.gfile.join(state, PLAN_FILE)
    plan = _read_json(plan_path) if tf.io.gfile.exists(plan_path) else None
    if plan is not None and plan.get("fingerprint") == key:
        return plan
    if plan is not None:
        logging.warning("%s holds an unfinished conversion of other input or options: starting over.", out_dir)
        for entry in plan.get("splits", {}).values():  # shards it had already moved into place
            for name in entry.get("files", []):
                _remove_file(tf.io.gfile.join(out_dir, name))
    foreign = sorted(p for p in _list(out_dir) if _SHARD_FILE.match(p))
    if foreign and not options.overwrite:
        raise DataError(
            f"--out {out_dir} already holds TFRecord shards ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}) "
            f"but no {METADATA_FILE}; choose an empty --out, or pass --overwrite to delete them"
        )
    for name in foreign:
        tf.io.gfile.remove(tf.io.gfile.join(out_dir, name))
    _remove_tree(state)
    target = int(options.target_shard_mb * 1024 * 1024)
    splits: dict[str, Any] = {}
    for split, num_items in source.split_sizes().items():
        if num_items == 0:
            raise DataError(f"{source.kind}: split {split!r} has no examples to convert")
        estimated = int(source.estimate_bytes(split))
        num_shards = num_shards_for(num_items, estimated, target, options.min_shards)
        if num_shards < options.min_shards:
            logging.warning("Split %r has only %d examples: writing %d shards, fewer than --min_shards=%d.",
                            split, num_items, num_shards, options.min_shards)
        splits[split] = {
            "num_items": num_items,
            "estimated_bytes": estimated,
            "files": [shard_name(split, k, num_shards, options.compression) for k in range(num_shards)],
            "bounds": shard_bounds(num_items, num_shards),
        }
    plan = {"fingerprint": key, "splits": splits}
    tf.io.gfile.makedirs(state)
    _write_json(plan_path, plan)
    return plan


def _done_shards(out_dir: str, state: str, plan: dict[str, Any]) -> set[str]:
    """Shards a previous run finished: their record exists and the file is in `_incomplete/` or in place."""
    present = set(_list(state)) | set(_list(out_dir))
    return {name for entry in plan["splits"].values() for name in entry["files"]
            if f"{name}.json" in present and name in present}


def _write_split(
    source: ConvertSource, split: str, entry: dict[str, Any], state: str, done: set[str],
    options: ConvertOptions, executor: concurrent.futures.Executor, window: int, bar: tqdm,
) -> int:
    """Writes the split's unfinished shards in order, encoding items in parallel. Returns shards written."""
    files, bounds = entry["files"], [tuple(b) for b in entry["bounds"]]
    pending = {k for k, name in enumerate(files) if name not in done}
    if not pending:
        return 0
    starts = [start for start, _ in bounds]
    first, last = bounds[min(pending)][0], bounds[-1][1]

    def jobs() -> Iterator[tuple[int, Any]]:
        index = first
        for item in source.items(split, first):
            if index >= last:
                break
            shard = bisect.bisect_right(starts, index) - 1
            if shard in pending:
                yield shard, item
            index += 1
        if index < last:
            raise DataError(
                f"{source.kind}: split {split!r} gave {index} examples but the plan expects {last}; the input "
                "changed during the conversion. Run the command again to start over."
            )

    def work(job: tuple[int, Any]) -> tuple[int, Union[bytes, Encoded, None], Optional[ItemError]]:
        shard, item = job
        try:
            return shard, source.encode(item), None
        except ItemError as error:
            return shard, None, error

    def streamed() -> Iterator[tuple[int, Union[bytes, Encoded, None], Optional[ItemError]]]:
        """A source that encodes many items per task (a Parquet row group) gives them back in order itself."""
        index = first
        for record, error in source.encode_stream(split, first, executor, options.num_workers()):
            if index >= last:
                break
            shard = bisect.bisect_right(starts, index) - 1
            if shard in pending:
                yield shard, record, error
            index += 1
        if index < last:
            raise DataError(
                f"{source.kind}: split {split!r} gave {index} examples but the plan expects {last}; the input "
                "changed during the conversion. Run the command again to start over."
            )

    results = streamed() if getattr(source, "encode_stream", None) else ordered_map(work, jobs(), executor, window)
    writer = _ShardWriter(state, options.compression)
    written = 0
    try:
        for shard, record, error in results:
            if shard != writer.shard:
                if writer.shard is not None:
                    writer.finish()
                    written += 1
                writer.start(shard, files[shard])
            bar.update(1)
            if error is not None:
                if options.on_error == "raise":
                    raise DataError(
                        f"{source.kind}: cannot convert {error.where}: {error.reason}. Fix or remove it and run "
                        "the same command again (finished shards are kept), or pass --on_error=skip to skip "
                        "such items and list them in metadata.json"
                    )
                writer.skip(error)
            elif isinstance(record, Encoded):
                writer.write(record.records, record.stats)
            else:
                writer.write(() if record is None else (record,))
        if writer.shard is not None:
            writer.finish()
            written += 1
    except BaseException:
        writer.abandon()
        raise
    return written


class _ShardWriter:
    """One shard at a time: a temporary file in `_incomplete/`, renamed when whole, then its record."""

    def __init__(self, state: str, compression: str) -> None:
        self.state = state
        self.options = tf.io.TFRecordOptions(compression_type=compression)
        self.shard: Optional[int] = None
        self.name = ""
        self.temp = ""
        self.count = 0
        self.skipped: list[dict[str, str]] = []
        self.stats: dict[str, int] = {}
        self.writer: Optional[tf.io.TFRecordWriter] = None

    def start(self, shard: int, name: str) -> None:
        self.shard, self.name, self.count, self.skipped, self.stats = shard, name, 0, [], {}
        self.temp = tf.io.gfile.join(self.state, f"{name}.tmp-{uuid.uuid4().hex[:8]}")
        self.writer = tf.io.TFRecordWriter(self.temp, self.options)

    def write(self, records: Sequence[bytes], stats: Optional[Mapping[str, int]] = None) -> None:
        """Writes one item's `records` (none: only its stats count, e.g. an empty document) and adds up `stats`."""
        for record in records:
            self.writer.write(record)
        self.count += len(records)
        if not stats:
            return
        totals = self.stats
        for key, value in stats.items():  # summed; a "max_" key keeps the largest (e.g. the longest document)
            value = int(value)
            if key[:4] == "max_":
                if value > totals.get(key, 0):
                    totals[key] = value
            else:
                totals[key] = totals.get(key, 0) + value

    def skip(self, error: ItemError) -> None:
        self.skipped.append({"where": error.where, "reason": error.reason})

    def finish(self) -> None:
        self.writer.close()
        self.writer = None
        path = tf.io.gfile.join(self.state, self.name)
        tf.io.gfile.rename(self.temp, path, overwrite=True)
        record = {"count": self.count, "bytes": tf.io.gfile.stat(path).length, "skipped": self.skipped}
        if self.stats:
            record["stats"] = self.stats
        _write_json(f"{path}.json", record)
        self.shard = None
        pause_after_shard()  # tests only (records/shard_pause.py)

    def abandon(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            _remove_file(self.temp)


def _finish(
    source: ConvertSource, out_dir: str, state: str, plan: dict[str, Any], key: str, options: ConvertOptions
) -> dict[str, Any]:
    """Moves every shard into place, writes the source's extra files, metadata.json last, then removes
    `_incomplete/`."""
    splits: dict[str, Any] = {}
    for split, entry in plan["splits"].items():
        counts, sizes, skipped, stats = [], [], [], []
        for name in entry["files"]:
            record = _read_json(tf.io.gfile.join(state, f"{name}.json"))
            staged = tf.io.gfile.join(state, name)
            if tf.io.gfile.exists(staged):
                tf.io.gfile.rename(staged, tf.io.gfile.join(out_dir, name), overwrite=True)
            counts.append(record["count"])
            sizes.append(record["bytes"])
            skipped.extend(record["skipped"])
            stats.append(record.get("stats", {}))
        splits[split] = {
            "files": entry["files"], "counts": counts, "bytes": sizes, "num_examples": sum(counts),
            "num_skipped": len(skipped), "skipped": skipped,
        }
        if hasattr(source, "split_metadata"):
            _add_new_keys(splits[split], source.split_metadata(split, stats), f"split {split!r}")
    metadata = {
        "format_version": FORMAT_VERSION,
        "name": source.name,
        "source": source.describe(),
        "features": source.features(),
        "class_names": source.class_names(),
        "compression": options.compression,
        "splits": splits,
        "fingerprint": key,
        "options": {"target_shard_mb": options.target_shard_mb, "min_shards": options.min_shards},
    }
    if hasattr(source, "extra_metadata"):
        _add_new_keys(metadata, source.extra_metadata(), "metadata")
    if hasattr(source, "write_files"):
        metadata["extra_files"] = list(source.write_files(out_dir))  # --overwrite removes them too
    write_metadata(out_dir, metadata)
    _remove_tree(state)
    return read_metadata(out_dir) or metadata


def _add_new_keys(target: dict[str, Any], extra: Mapping[str, Any], where: str) -> None:
    """A source's hook adds keys; the converter's own (files, counts, fingerprint, ...) are never replaced."""
    clash = sorted(set(extra) & set(target))
    if clash:
        raise ValueError(f"a source's metadata hook may only add keys to the {where}; {clash} are the converter's")
    target.update(extra)


def _list(directory: str) -> list[str]:
    return [n.rstrip("/") for n in tf.io.gfile.listdir(directory)] if tf.io.gfile.isdir(directory) else []


def _remove_file(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def _remove_tree(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def _write_json(path: str, value: Any) -> None:
    """Temporary file + rename: a reader sees the whole file or none."""
    temp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with tf.io.gfile.GFile(temp, "w") as handle:
        handle.write(json.dumps(value, indent=1, sort_keys=True))
    tf.io.gfile.rename(temp, path, overwrite=True)


def _read_json(path: str) -> Any:
    with tf.io.gfile.GFile(path, "r") as handle:
        return json.loads(handle.read())

"""Disk caches (data.cache.path) keyed on everything upstream of them, and safe reuse of their files.

Why a key: `Dataset.cache(prefix)` replays whatever sits at `prefix`, whatever the config says now.
A cache written from the train files was served for the validation files once they were swapped
in the config. So each input pipeline caches to `<path>/pipeline<i>-of-<n>.<fingerprint>`: a hash
of the files (path, size, mtime), the feature spec, the parse mode, the preprocess ops with their
arguments, the source config and the seed. A changed config gets a new prefix, never a stale one.

Why recovery: TensorFlow's cache writer holds `<prefix>_<shard>.lockfile` while it writes, and a
process killed mid-write leaves it behind, so the next run fails with AlreadyExistsError. Before
using a prefix, leftovers of a writer that is gone are removed (with a warning); a live writer's
files are left alone. See `writer_alive` for how a live writer is told from a dead one.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Protocol

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import ConfigError
from tpu_pipeline.system import local_path

if TYPE_CHECKING:
    from tpu_pipeline.config.data import DataConfig


class Plan(Protocol):
    """What a fingerprint reads of a `plan.Plan` (its decisions: `.value` and `.reason`), named here so
    that this module, which the stages import, imports no plan (the plan imports the stages' modes)."""

    files: Any
    features: Any
    parse: Any
    order: Any

FINGERPRINT_CHARS = 16  # hex digits of sha256: 64 bits, no accidental collision between configs
FORMAT = 1  # bump when what goes into the key changes
# Source keys that change only how fast the same records are read, not which or in what order.
SPEED_ONLY_SOURCE_KEYS = ("num_parallel_calls", "buffer_size", "record_batch")
HEARTBEAT_SECONDS = 60.0  # a writing process rewrites its marker this often
STALE_AFTER_SECONDS = 600.0  # a writer on another host with no heartbeat for this long is gone
MARKER_SUFFIX = ".writer"


# ----------------------------------------------------------------------------------------- the key

def file_stamp(path: str) -> dict[str, Any]:
    """What identifies a file's content cheaply: path, size and modification time (one stat)."""
    try:
        stat = tf.io.gfile.stat(path)
    except tf.errors.NotFoundError:
        return {"path": path, "missing": True}
    return {"path": path, "size": int(stat.length), "mtime_ns": int(stat.mtime_nsec)}


def source_files(config: "DataConfig", plan: "Plan") -> list[str]:
    """The files the cached elements come from: the TFRecord shards, or the .npz of an array source."""
    files = list(plan.files.value)
    if not files and getattr(config.source, "type", "") == "arrays":
        files = [local_path(config.source.path)]
    return files


def fingerprint_inputs(config: "DataConfig", plan: "Plan") -> dict[str, Any]:
    """Everything that decides what the cache holds (elements and their order), as plain JSON values.

    Augment ops, shuffle, repeat and batch run after the cache, so they are not in it.
    """
    source = {key: value for key, value in config.source.model_dump().items() if key not in SPEED_ONLY_SOURCE_KEYS}
    features = {name: spec.model_dump() if hasattr(spec, "model_dump") else spec
                for name, spec in plan.features.value.items()}
    return {
        "format": FORMAT,
        "source": source,
        "files": [file_stamp(path) for path in source_files(config, plan)],
        "features": features,
        "parse": plan.parse.value,
        "preprocess": [op.model_dump() for op in config.preprocess],
        "seed": config.seed,  # file order per pipeline, and the seeds of random preprocess ops
        "order": plan.order.value,
    }


def fingerprint(config: "DataConfig", plan: "Plan") -> str:
    """A short hash of the canonical JSON of `fingerprint_inputs`."""
    text = json.dumps(fingerprint_inputs(config, plan), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:FINGERPRINT_CHARS]


# ------------------------------------------------------------------------------- the path, checked

def _file_above(path: str) -> Optional[str]:
    """The nearest existing ancestor of local `path` (itself included) when it is not a directory."""
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
    return None if os.path.isdir(current) else current


def _first_line(error: BaseException) -> str:
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    return text.strip().splitlines()[0]


def check_cache_path(path: str, where: str = "data.cache.path") -> None:
    """A one-line ConfigError, before any dataset is built, when `path` cannot hold a cache directory:
    under (or equal to) a regular file, or not writable (found by writing a probe file)."""
    path = local_path(path)
    if "://" not in path:
        blocking = _file_above(path)
        if blocking == os.path.abspath(path):
            raise ConfigError(f"{where}: {path!r} is a file, not a directory; set {where} to a directory "
                              "(it is created if missing; each input pipeline writes its cache files in it)")
        if blocking is not None:
            raise ConfigError(f"{where}: {path!r} is under the file {blocking!r}, which cannot hold a directory; "
                              f"set {where} to a directory outside it, e.g. {os.path.dirname(blocking)}/cache")
    probe = tf.io.gfile.join(path, f".write-probe-{socket.gethostname()}-{os.getpid()}")
    try:
        tf.io.gfile.makedirs(path)
        with tf.io.gfile.GFile(probe, "w") as handle:
            handle.write("probe")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as error:
        raise ConfigError(f"{where}: {path!r} is not writable ({_first_line(error)}); set {where} to a "
                          "writable directory, or to '' to cache in memory") from None


# ------------------------------------------------------------------ writers: markers and heartbeats

def _process_start(pid: int) -> Optional[str]:
    """The start time of process `pid` (clock ticks since boot, Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _process_state(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, start: Optional[str]) -> bool:
    """Whether process `pid` of this host still runs and is the same process (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _process_state(pid) in ("Z", "X"):  # killed, not yet reaped by its parent
        return False
    now = _process_start(pid)
    return start is None or now is None or now == start


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def read_marker(prefix: str) -> Optional[dict[str, Any]]:
    """The writer a prefix's marker names ({host, pid, start}), or None (no marker, or unreadable)."""
    try:
        with tf.io.gfile.GFile(prefix + MARKER_SUFFIX, "r") as handle:
            return json.loads(handle.read())
    except (tf.errors.OpError, ValueError):
        return None


def write_marker(prefix: str) -> None:
    with tf.io.gfile.GFile(prefix + MARKER_SUFFIX, "w") as handle:
        handle.write(json.dumps({**_me(), "time": time.time()}))


_HEARTBEATS: set[str] = set()
_HEARTBEAT_LOCK = threading.Lock()
_HEARTBEAT_THREAD: Optional[threading.Thread] = None


def _beat() -> None:
    """Rewrites this process's markers until their cache is complete or another writer took them."""
    while True:
        time.sleep(HEARTBEAT_SECONDS)
        with _HEARTBEAT_LOCK:
            prefixes = sorted(_HEARTBEATS)
        for prefix in prefixes:
            try:
                owner = read_marker(prefix)
                if tf.io.gfile.exists(prefix + ".index") or not owner or owner.get("pid") != os.getpid():
                    with _HEARTBEAT_LOCK:
                        _HEARTBEATS.discard(prefix)
                    continue
                write_marker(prefix)
            except tf.errors.OpError:
                pass  # a flaky filesystem skips a beat; the bound allows for many


def start_heartbeat(prefix: str) -> None:
    """Keeps `prefix`'s marker fresh while this process lives: how other hosts see a live writer."""
    global _HEARTBEAT_THREAD
    with _HEARTBEAT_LOCK:
        _HEARTBEATS.add(prefix)
        if _HEARTBEAT_THREAD is None:
            _HEARTBEAT_THREAD = threading.Thread(target=_beat, name="cache-heartbeat", daemon=True)
            _HEARTBEAT_THREAD.start()


def _age(paths: list[str]) -> float:
    """Seconds since the newest of `paths` was last written."""
    times = []
    for path in paths:
        try:
            times.append(tf.io.gfile.stat(path).mtime_nsec / 1e9)
        except tf.errors.NotFoundError:
            pass
    return time.time() - max(times) if times else float("inf")


def writer_alive(prefix: str, leftovers: list[str]) -> tuple[bool, str]:
    """(whether a live process may be writing `prefix`, why).

    The writer's marker (written when a pipeline starts a fresh cache) names host, pid and process
    start time. On this host that is decisive: the pid is gone, a zombie, or reused by a younger
    process → dead, at once, which is the usual restart. This very process → alive (an iterator of
    ours is writing; TensorFlow removes its lockfile itself when one is dropped half way). Another
    host's pid cannot be checked, so there the marker's heartbeat decides: rewritten every
    HEARTBEAT_SECONDS while the writer lives, dead after STALE_AFTER_SECONDS of silence (a lockfile's
    age alone would not do: a large cache takes hours to write, and its data file is written only
    when a buffer fills). No marker at all (an older version, or plain tf.data): the same bound on
    the newest leftover file.
    """
    owner = read_marker(prefix)
    me = _me()
    if owner and owner.get("host") == me["host"]:
        pid = int(owner.get("pid", -1))
        if pid == me["pid"] and owner.get("start") == me["start"]:
            return True, "this process is writing it"
        if _pid_alive(pid, owner.get("start")):
            return True, f"process {pid} on this host is writing it"
        return False, f"its writer, process {pid} on this host, is gone"
    age = _age(leftovers + [prefix + MARKER_SUFFIX])
    who = f"host {owner.get('host')} pid {owner.get('pid')}" if owner else "an unknown writer"
    if age < STALE_AFTER_SECONDS:
        return True, f"{who} wrote it {age:.0f} s ago"
    return False, f"{who} has written nothing for {age:.0f} s (over {STALE_AFTER_SECONDS:.0f} s)"


# ------------------------------------------------------------------------------ using a prefix

def partial_files(prefix: str) -> list[str]:
    """Files an unfinished writer leaves: `<prefix>_<shard>.lockfile`, its shard bundles
    (`<prefix>_<shard>.data-*.tempstate*`, `.index`), and a half-merged `<prefix>.data-*`."""
    found = tf.io.gfile.glob(prefix + "_*") + tf.io.gfile.glob(prefix + ".data-*")
    return sorted(set(found))


def prepare_prefix(prefix: str, where: str = "data.cache.path") -> str:
    """Makes `prefix` ready for `Dataset.cache`: 'reuse' when a complete cache is there, else 'write'
    (after removing a dead writer's leftovers); logs which, naming the files."""
    directory = os.path.dirname(prefix)
    if tf.io.gfile.exists(prefix + ".index"):
        logging.info("%s: reusing the complete disk cache %s.* in %s (same fingerprint of files, features, ops "
                     "and source config)", where, os.path.basename(prefix), directory)
        return "reuse"
    leftovers = partial_files(prefix)
    if leftovers:
        alive, why = writer_alive(prefix, leftovers)
        if alive:
            logging.warning("%s: %s is being written (%s); leaving its %d file(s) alone", where, prefix, why,
                            len(leftovers))
            return "write"
        for path in leftovers + ([prefix + MARKER_SUFFIX] if tf.io.gfile.exists(prefix + MARKER_SUFFIX) else []):
            tf.io.gfile.remove(path)
        logging.warning("%s: removed %d file(s) of an interrupted cache write at %s (%s): %s; writing it again",
                        where, len(leftovers), prefix, why, ", ".join(os.path.basename(p) for p in leftovers))
    write_marker(prefix)
    start_heartbeat(prefix)
    logging.info("%s: writing a new disk cache %s.* in %s (no complete cache with this fingerprint yet)",
                 where, os.path.basename(prefix), directory)
    return "write"

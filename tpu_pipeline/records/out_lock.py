"""The lock `convert` holds on its --out directory: `OUT/.convert.lock`, JSON naming host, pid and start.

Two converts writing into one directory interleave their shards and both end by writing
metadata.json, which marks a wrong dataset as finished. So a second convert refuses at once,
naming the holder. A lock left by a killed run on this host (its pid is gone) is taken over with a
warning; one from another host is never taken over, as its pid cannot be checked from here.

Local disks: created with O_CREAT|O_EXCL, atomic. Object stores (gs://, via tf.io.gfile) have no
exclusive create here, so there it is best effort: check, write, read back.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import time
import uuid
from typing import Iterator, Optional

import tensorflow as tf
from absl import logging

from tpu_pipeline.errors import DataError

LOCK_FILE = ".convert.lock"
_READ_RETRIES = 20  # the holder fills its file just after creating it: wait up to ~1 s for the content
_TAKEOVER_ATTEMPTS = 100  # each failed attempt waits 50 ms while a rival takes a stale lock over
_GUARD_STALE_S = 2.0  # a takeover takes microseconds: an older guard file was left by a killed run


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds the lock, as written in the lock file (`token` tells our lock from a successor's)."""

    host: str
    pid: int
    since: str
    token: str

    @staticmethod
    def mine() -> "Holder":
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return Holder(socket.gethostname(), os.getpid(), since, uuid.uuid4().hex)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def parse(text: str) -> Optional["Holder"]:
        try:
            value = json.loads(text)
            return Holder(str(value["host"]), int(value["pid"]), str(value["since"]), str(value["token"]))
        except (ValueError, KeyError, TypeError):
            return None


@contextlib.contextmanager
def out_lock(out_dir: str) -> Iterator[Holder]:
    """Holds `OUT/.convert.lock` for the body; raises DataError at once when another convert holds it."""
    path = lock_path(out_dir)
    holder = Holder.mine()
    if "://" in out_dir:
        _acquire_remote(out_dir, path, holder)
    else:
        _acquire_local(out_dir, path, holder)
    try:
        yield holder
    finally:
        _release(path, holder)


def lock_path(out_dir: str) -> str:
    return tf.io.gfile.join(out_dir, LOCK_FILE) if "://" in out_dir else os.path.join(out_dir, LOCK_FILE)


def _acquire_local(out_dir: str, path: str, holder: Holder) -> None:
    """O_EXCL create (atomic); a stale lock of this host is removed, then the create is retried."""
    os.makedirs(out_dir, exist_ok=True)
    for _ in range(_TAKEOVER_ATTEMPTS):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            text = _read_local(path)
            if text is None:  # released between our create and our read: try again
                continue
            _refuse_unless_stale(out_dir, path, text)
            _take_over_local(path, text)
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(holder.to_json())
        return
    raise DataError(f"--out {out_dir}: could not take the lock {path}, other converts keep taking it; run one "
                    f"convert at a time into one --out; if none is running, delete {path} and {path}.takeover")


def _take_over_local(path: str, stale: str) -> None:
    """Removes the stale lock file under a short-lived guard file, so that of several runs taking over
    at once only one removes it (re-checked under the guard); the others retry the O_EXCL create."""
    guard = f"{path}.takeover"
    try:
        fd = os.open(guard, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):  # left by a run killed within its takeover
            if time.time() - os.stat(guard).st_mtime > _GUARD_STALE_S:
                os.remove(guard)
        time.sleep(0.05)
        return
    try:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            with open(path) as handle:
                still_stale = handle.read() == stale
            if still_stale:
                os.remove(path)
    finally:
        os.remove(guard)


def _read_local(path: str) -> Optional[str]:
    """The lock file's text once its holder has written it; None when the file is gone."""
    text = ""
    for _ in range(_READ_RETRIES):
        try:
            with open(path) as handle:
                text = handle.read()
        except FileNotFoundError:
            return None
        if Holder.parse(text) is not None:
            break
        time.sleep(0.05)
    return text


def _acquire_remote(out_dir: str, path: str, holder: Holder) -> None:
    """Best effort on object stores: tf.io.gfile has no exclusive create, so two runs starting within
    the same second can both pass the check; reading back narrows that window but does not close it."""
    tf.io.gfile.makedirs(out_dir)
    if tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path, "r") as handle:
            _refuse_unless_stale(out_dir, path, handle.read())
        tf.io.gfile.remove(path)
    with tf.io.gfile.GFile(path, "w") as handle:
        handle.write(holder.to_json())
    with tf.io.gfile.GFile(path, "r") as handle:
        text = handle.read()
    if text != holder.to_json():  # another run wrote it between our check and our write
        raise _busy(out_dir, path, Holder.parse(text))


def _refuse_unless_stale(out_dir: str, path: str, text: str) -> None:
    """Raises DataError naming the holder, unless it is a dead process of this host (then a warning)."""
    other = Holder.parse(text)
    if other is None or other.host != socket.gethostname() or _alive(other.pid):
        raise _busy(out_dir, path, other)
    logging.warning("--out %s: taking over %s, left by a convert that is no longer running (host %s, pid %d, "
                    "since %s).", out_dir, path, other.host, other.pid, other.since)


def _busy(out_dir: str, path: str, other: Optional[Holder]) -> DataError:
    """The one-line refusal: which directory, who holds it since when, and how to get past it."""
    if other is None:
        return DataError(f"--out {out_dir} is locked by {path}, which names no holder; wait for the convert "
                         f"using it to finish, or stop it; if no convert is running, delete {path}")
    held = f"--out {out_dir} is in use by a convert on host {other.host}, pid {other.pid}, since {other.since}"
    if other.host != socket.gethostname():
        return DataError(f"{held} (another host: not taken over automatically); wait for it to finish, or stop "
                         f"it; if no convert is running on {other.host}, delete {path}")
    return DataError(f"{held}; wait for it to finish, or stop it; if no convert is running, delete {path}")


def _alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


def _release(path: str, holder: Holder) -> None:
    """Removes the lock file if it is still ours (a user may have deleted it and another run taken it)."""
    try:
        with tf.io.gfile.GFile(path, "r") as handle:
            text = handle.read()
    except tf.errors.NotFoundError:
        return
    if Holder.parse(text) == holder:
        with contextlib.suppress(tf.errors.NotFoundError):
            tf.io.gfile.remove(path)


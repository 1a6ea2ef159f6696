"""What a file is, from its first bytes: so a folder of text (or Parquet) given where TFRecords are
expected is named for what it is, with the convert command that makes TFRecords of it, instead of a
CRC failure or an unfinished conversion (issue 47 item 4)."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

SNIFF_BYTES = 4096
PARQUET_MAGIC = b"PAR1"
_TEXT_CONTROL = set(range(32)) - {9, 10, 12, 13}  # tab, newline, form feed, carriage return are text


def file_kind(path: str) -> Optional[str]:
    """'parquet' or 'text' when the file's first bytes say so, else None (a TFRecord, or unknown)."""
    try:
        with tf.io.gfile.GFile(path, "rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except (tf.errors.OpError, OSError):
        return None
    return bytes_kind(head)


def bytes_kind(head: bytes) -> Optional[str]:
    """The kind of a file that begins with `head` (see `file_kind`)."""
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if not head:
        return None
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as error:
        if error.start < len(head) - 3:  # not just a character cut at the end of the sample
            return None
    # A TFRecord begins with an 8-byte little-endian length: zero bytes, which text never holds.
    if any(byte in _TEXT_CONTROL for byte in head):
        return None
    return "text"


def convert_hint(kind: str, paths: str, out: str = "DIR") -> str:
    """The sentence that names what the files are and the command that converts them."""
    what = {"text": "text files", "parquet": "Parquet files"}[kind]  # each kind is also its `--from` name
    return (f"these are {what}, not TFRecords: convert them with "
            f"`tpu-pipeline convert --from {kind} {paths} --out {out}` and point the config at {out}")


def file_hint(path: str) -> Optional[str]:
    """The convert hint for a file that failed to read as a TFRecord, when it is text or Parquet."""
    kind = file_kind(path)
    return convert_hint(kind, sibling_glob(path)) if kind is not None else None


def sibling_glob(path: str) -> str:
    """The files beside `path` with its suffix: what a convert command of the folder's text would name."""
    folder, name = path.rsplit("/", 1) if "/" in path else ("", path)
    pattern = f"*.{name.rsplit('.', 1)[-1]}" if "." in name else "*"
    return f"{folder}/{pattern}" if folder else pattern


def kind_of_folder(directory: str) -> tuple[Optional[str], str]:
    """(the kind shared by the folder's first files, a glob of them) when its files are text or Parquet."""
    try:
        names = sorted(name for name in tf.io.gfile.listdir(directory) if not name.endswith("/"))
    except (tf.errors.OpError, OSError):
        return None, ""
    kinds = {file_kind(tf.io.gfile.join(directory, name)) for name in names[:8]}
    if len(kinds) != 1 or None in kinds:
        return None, ""
    kind = kinds.pop()
    suffixes = {name.rsplit(".", 1)[-1] for name in names if "." in name}
    pattern = f"*.{suffixes.pop()}" if len(suffixes) == 1 else "*"
    return kind, tf.io.gfile.join(directory, pattern)

"""TFRecord framing read in Python, record by record, with both CRCs checked and every fault located.

TF's reader stops a file at its first bad CRC and says only `corrupted record at 18957`, without the
file. This reader knows the format (per record: uint64 length, masked CRC32C of the length, the
bytes, masked CRC32C of the bytes), so it reports file, record index and byte offset, and it goes on
after a bad data CRC (the length was sound, so the next record is found). A bad length CRC or a
truncated tail leaves the rest of the file unreadable: that is one fault, "the rest of the file".
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import struct
import zlib
from typing import BinaryIO, Iterator, Union

import google_crc32c
import tensorflow as tf

_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Record:
    index: int
    offset: int  # byte offset of its header in the (decompressed) stream
    data: bytes


@dataclasses.dataclass(frozen=True)
class FramingFault:
    index: int  # the record it concerns (the first unreadable one for a broken tail)
    offset: int
    kind: str  # 'truncated' | 'bad_length_crc' | 'bad_data_crc' | 'unreadable'
    what: str
    rest_lost: bool  # True when nothing after it can be read


def _open(path: str, compression: str) -> BinaryIO:
    raw = tf.io.gfile.GFile(path, "rb")
    if compression == "GZIP":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]
    if compression == "ZLIB":
        return io.BytesIO(zlib.decompress(raw.read()))
    return raw  # type: ignore[return-value]


def scan_records(path: str, compression: str = "") -> Iterator[Union[Record, FramingFault]]:
    """Every record of the file, and a FramingFault where one is damaged (the last item if the rest is lost)."""
    with _open(path, compression) as handle:
        index, offset = 0, 0
        while True:
            try:
                header = handle.read(12)
            except (OSError, EOFError, zlib.error) as error:
                yield FramingFault(index, offset, "unreadable", f"cannot be decompressed ({error})", True)
                return
            if not header:
                return
            if len(header) < 12:
                yield FramingFault(index, offset, "truncated", f"the file ends inside a record header ({len(header)} of 12 bytes)", True)
                return
            length_bytes, length_crc = header[:8], struct.unpack("<I", header[8:])[0]
            if masked_crc(length_bytes) != length_crc:
                yield FramingFault(index, offset, "bad_length_crc", "the record length fails its CRC: the framing is broken", True)
                return
            (length,) = struct.unpack("<Q", length_bytes)
            try:
                body = handle.read(length + 4)
            except (OSError, EOFError, zlib.error) as error:
                yield FramingFault(index, offset, "unreadable", f"cannot be decompressed ({error})", True)
                return
            if len(body) < length + 4:
                yield FramingFault(index, offset, "truncated",
                                   f"the file ends inside a record ({len(body)} of {length + 4} bytes)", True)
                return
            data, data_crc = body[:length], struct.unpack("<I", body[length:])[0]
            if masked_crc(data) != data_crc:
                yield FramingFault(index, offset, "bad_data_crc", "the record's bytes fail their CRC (corrupted)", False)
            else:
                yield Record(index, offset, data)
            index += 1
            offset += 12 + length + 4


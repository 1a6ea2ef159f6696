"""An encoded image's format, height and width from its header alone (no decoding).

`convert --from parquet|hf` stores each image's original bytes; reading the header checks that they
are an image TensorFlow decodes (JPEG, PNG, GIF, BMP, WebP) and gives the `height` and `width`
features in microseconds, where a full decode costs a millisecond or more. `tpu-pipeline verify`
decodes every image when you want that check too.
"""
from __future__ import annotations

import struct

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class NotAnImage(ValueError):
    pass


def image_size(data: bytes) -> tuple[str, int, int]:
    """(format, height, width); raises NotAnImage with the reason."""
    try:
        if data[:8] == b"\x89PNG\r\n\x1a\n":
            if data[12:16] != b"IHDR":
                raise NotAnImage("a PNG without its IHDR header")
            width, height = struct.unpack(">II", data[16:24])
            return "png", height, width
        if data[:2] == b"\xff\xd8":
            return ("jpeg", *_jpeg_size(data))
        if data[:6] in (b"GIF87a", b"GIF89a"):
            width, height = struct.unpack("<HH", data[6:10])
            return "gif", height, width
        if data[:2] == b"BM":
            width, height = struct.unpack("<ii", data[18:26])
            return "bmp", abs(height), width
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return ("webp", *_webp_size(data))
    except struct.error:
        raise NotAnImage(f"its header is cut short ({len(data)} bytes)") from None
    start = bytes(data[:8])
    raise NotAnImage(f"not a JPEG, PNG, GIF, BMP or WebP image ({len(data)} bytes starting {start!r})")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise NotAnImage(f"a JPEG whose markers break at byte {at}")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        if marker in _SOF:
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return height, width
        if marker == 0xDA:  # start of scan before any frame header
            break
        at += 2 + length
    raise NotAnImage(f"a JPEG with no frame header in its {len(data)} bytes (cut short?)")


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return height & 0x3FFF, width & 0x3FFF
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(data[27:30], "little") + 1, int.from_bytes(data[24:27], "little") + 1
    raise NotAnImage(f"a WebP file with an unknown chunk {bytes(chunk)!r}")

"""A minimal reader of TensorBoard event files: scalar series only, no tensorboard needed.

Event files are TFRecord streams (``uint64 length, uint32 crc, data, uint32
crc``) of ``Event`` protocol buffers. Scalars live in ``Event.summary.value``
as ``simple_value`` (torch's ``SummaryWriter.add_scalar``, SB3) or as a
one-element float ``tensor`` (TF2 writers). CRCs are not checked: a damaged
record ends the read of that file, keeping what came before.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["read_scalars"]

# protobuf wire types
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
# TensorProto dtypes we read
_DT_FLOAT, _DT_DOUBLE = 1, 2


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) for each field of one message: an int for varints, else bytes."""
    pos = 0
    val: int | bytes
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == _VARINT:
            val, pos = _varint(buf, pos)
        elif wt == _FIXED64:
            val, pos = buf[pos : pos + 8], pos + 8
        elif wt == _LEN:
            n, pos = _varint(buf, pos)
            val, pos = buf[pos : pos + n], pos + n
        elif wt == _FIXED32:
            val, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, val


def _tensor_scalar(buf: bytes) -> float | None:
    dtype, content = _DT_FLOAT, b""
    floats: list[float] = []
    doubles: list[float] = []
    for num, wt, val in _fields(buf):
        if num == 1 and wt == _VARINT:
            dtype = int(val)
        elif num == 4 and wt == _LEN:
            content = bytes(val)
        elif num == 5:
            floats.extend(struct.unpack(f"<{len(val) // 4}f", val) if wt == _LEN else struct.unpack("<f", val))
        elif num == 6:
            doubles.extend(struct.unpack(f"<{len(val) // 8}d", val) if wt == _LEN else struct.unpack("<d", val))
    if floats or doubles:
        return float((floats or doubles)[0])
    if content and dtype == _DT_FLOAT and len(content) >= 4:
        return float(struct.unpack("<f", content[:4])[0])
    if content and dtype == _DT_DOUBLE and len(content) >= 8:
        return float(struct.unpack("<d", content[:8])[0])
    return None


def _summary_values(buf: bytes) -> Iterator[tuple[str, float]]:
    for num, wt, val in _fields(buf):
        if num != 1 or wt != _LEN:
            continue
        tag, value = "", None
        for vnum, vwt, vval in _fields(val):
            if vnum == 1 and vwt == _LEN:
                tag = bytes(vval).decode("utf-8", "replace")
            elif vnum == 2 and vwt == _FIXED32:
                value = float(struct.unpack("<f", vval)[0])
            elif vnum == 8 and vwt == _LEN:
                value = _tensor_scalar(vval)
        if tag and value is not None:
            yield tag, value


def _records(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[pos : pos + 8])
        start, end = pos + 12, pos + 12 + n
        if end + 4 > len(data):
            return
        yield data[start:end]
        pos = end + 4


def read_scalars(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Scalar series in one event file: tag -> [(step, value), ...] in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for rec in _records(Path(path).read_bytes()):
        try:
            step, summary = 0, None
            for num, wt, val in _fields(rec):
                if num == 2 and wt == _VARINT:
                    step = int(val)
                elif num == 5 and wt == _LEN:
                    summary = val
            if summary is not None:
                for tag, value in _summary_values(summary):
                    out.setdefault(tag, []).append((step, value))
        except (ValueError, struct.error):
            break  # a damaged record: keep what was read
    return out

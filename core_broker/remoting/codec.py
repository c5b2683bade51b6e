"""Frame codec (sans-io): bytes in, frames out; frames in, bytes out.

Frame: u32 big-endian length, then a msgpack array:
  request  [0, call_id, method, args(list), kwargs(map)]
  response [1, call_id, ok(bool), result | [error_code, error_class, message]]
"""

from __future__ import annotations

import struct
from typing import Any

from .wire import packb, unpackb

REQUEST = 0
RESPONSE = 1
MAX_FRAME = 64 * 1024 * 1024
_LEN = struct.Struct(">I")


class FrameError(Exception):
    """The peer sent something that is not a frame of this protocol."""


def encode(frame: list) -> bytes:
    body = packb(frame)
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[list[Any]]:
        self._buf += data
        out = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self._max:
                raise FrameError(f"frame of {n} bytes exceeds the limit of {self._max}")
            if len(buf) - pos - 4 < n:
                break
            try:
                frame = unpackb(bytes(buf[pos + 4 : pos + 4 + n]))
            except Exception as e:  # msgpack and the type hooks raise several types for bad input
                raise FrameError(f"undecodable frame: {e}") from None
            if not isinstance(frame, list) or len(frame) < 3 or frame[0] not in (REQUEST, RESPONSE):
                raise FrameError("frame is not a request or a response")
            out.append(frame)
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

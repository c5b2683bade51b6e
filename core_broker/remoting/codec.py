"""Frame codec (sans-io): bytes in, frames out; frames in, bytes out.

Frame: u32 big-endian length, then a msgpack array:
  request  [REQUEST, call_id, method, args(list), kwargs(map)]
  response [RESPONSE, call_id, ok(bool), result | [error_code, error_class, message]]
  auth     [AUTH, step, value, ...]   the cluster-secret handshake at a connection's start (``auth.py``)

The frame kind carries the format's version (high nibble): gateways, brokers and
nameservers must run the same unimq version, and a peer of another version is
refused at its first frame with an error that says so rather than misread. v1
(kinds 0 and 1) sent every message as an extension type; v2 sends the data path's
batches as plain blocks (``rows.py``).
"""

from __future__ import annotations

import struct
from typing import Any

from .wire import packb, unpackb

VERSION = 2
REQUEST = VERSION << 4
RESPONSE = REQUEST | 1
AUTH = REQUEST | 2
_KINDS = (REQUEST, RESPONSE, AUTH)
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
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[list[Any]]:
        self._buf += data
        out = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self.max_frame:
                raise FrameError(f"frame of {n} bytes exceeds the limit of {self.max_frame}")
            if len(buf) - pos - 4 < n:
                break
            try:
                frame = unpackb(bytes(buf[pos + 4 : pos + 4 + n]))
            except Exception as e:  # msgpack and the type hooks raise several types for bad input
                raise FrameError(f"undecodable frame: {e}") from None
            if not isinstance(frame, list) or len(frame) < 3 or frame[0] not in _KINDS:
                kind = frame[0] if isinstance(frame, list) and frame else None
                if type(kind) is int and 0 <= kind < 256 and (kind >> 4 or 1) != VERSION:
                    raise FrameError(
                        f"the peer speaks unimq RPC v{kind >> 4 or 1}, this process v{VERSION}: "
                        "run the same unimq version on every node"
                    )
                raise FrameError("frame is not a request or a response")
            out.append(frame)
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

"""Frames written to one connection in one event-loop turn leave in one write.

A gateway under load answers and forwards many calls per loop turn; written one
by one, each frame is a send syscall, and on a local connection each send also
runs the peer's receive path and wakes it. Collected until the end of the turn,
they cost one syscall and one wakeup. The price is one loop turn of delay for
the first frame, which a caller waiting on a network round trip does not see.
"""

from __future__ import annotations

import asyncio


class Outbox:
    __slots__ = ("writer", "_frames", "_loop")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._frames: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def put(self, frame: bytes) -> None:
        frames = self._frames
        frames.append(frame)
        if len(frames) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        frames = self._frames
        self._frames = []
        if frames and not self.writer.is_closing():
            self.writer.write(frames[0] if len(frames) == 1 else b"".join(frames))

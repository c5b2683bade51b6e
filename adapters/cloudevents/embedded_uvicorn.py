"""uvicorn embedded in unimq's event loop: our signal handling, and no idle ticking.

Two things of uvicorn's stand-alone server do not fit a door inside a larger
server:

- its signal handlers would replace ours and re-raise the signal after its
  shutdown, killing the process before the store is flushed;
- its main loop wakes every 0.1 s, only to refresh the ``date`` response header
  once a second and to look at ``should_exit``. On an idle server that tick was
  the largest single cost. Here the loop waits for ``should_exit`` to be set,
  and the header is refreshed when a response asks for it and the second
  changed (one clock read per response).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from email.utils import formatdate
from typing import Iterator

import uvicorn
from uvicorn.server import ServerState


class _LazyDateState(ServerState):
    """uvicorn's shared state whose ``default_headers`` carry a ``date`` that is never stale.

    uvicorn's protocols read ``server_state.default_headers`` for every response;
    its own ``on_tick`` assigns it (date first, then the configured headers).
    """

    def __init__(self, with_date: bool) -> None:
        self._with_date = with_date
        self._extra: list[tuple[bytes, bytes]] = []
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []
        super().__init__()

    @property  # type: ignore[override]
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        if not self._with_date:
            return self._extra
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._headers = [(b"date", formatdate(now, usegmt=True).encode())] + self._extra
        return self._headers

    @default_headers.setter
    def default_headers(self, value: list[tuple[bytes, bytes]]) -> None:
        self._extra = [h for h in value if h[0] != b"date"]
        self._second = -1  # rebuild with the new headers on next use


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signals to its host and sleeps until told to exit."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit = asyncio.Event()
        super().__init__(config)
        self.server_state = _LazyDateState(config.date_header)

    @property  # type: ignore[override]
    def should_exit(self) -> bool:
        return self._exit.is_set()

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value:
            self._exit.set()
        else:
            self._exit.clear()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        await self.on_tick(0)  # the configured default headers, once
        if self.limit_max_requests is not None:  # not used by unimq; keep uvicorn's polling for it
            await super().main_loop()
            return
        await self._exit.wait()

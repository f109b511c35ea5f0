"""Time limits on reading a request, and a cap on open connections, for uvicorn.

uvicorn (0.54) times out only idle keep-alive connections (`timeout_keep_alive`, armed
after a response): a client that opens a connection and sends its headers, or its body,
a byte at a time is kept for ever, and `limit_concurrency` answers 503 only once headers
are complete. This protocol is uvicorn's own httptools protocol with three additions:

- the request line and headers must arrive within `header_timeout` seconds of the
  connection opening (or, on a kept-alive connection, of the request's first byte);
- the body must arrive within `body_timeout` seconds of the headers;
- a connection past `max_connections` open ones is closed at once.

A connection that misses a deadline is closed; a request already handed to the app then
sees `http.disconnect`, which aborts its engine work like any client disconnect.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


class TimedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1024

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            log.warning("refusing a connection: %d are open already", self.max_connections)
            transport.close()
            return
        self._arm(self.header_timeout)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a further request on a kept-alive connection
            self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def timed_protocol(
    header_timeout: float, body_timeout: float, max_connections: int
) -> type[TimedHttpToolsProtocol]:
    """The protocol class with these limits, for `uvicorn.Config(http=...)`."""
    return type(
        "TimedHttpToolsProtocol",
        (TimedHttpToolsProtocol,),
        {
            "header_timeout": header_timeout,
            "body_timeout": body_timeout,
            "max_connections": max_connections,
        },
    )

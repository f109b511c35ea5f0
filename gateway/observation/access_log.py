"""One log line per HTTP request, written when its response (stream included) has ended."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("loragate.access")


class AccessLog:
    """ASGI wrapper around the whole app, so 404s and streams are logged like the rest."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = None

        async def send_and_note(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            client = scope.get("client") or ("-", 0)
            log.info(
                '%s:%s "%s %s" %s %.1fms',
                client[0],
                client[1],
                scope["method"],
                scope["path"],
                status if status is not None else "-",
                (time.perf_counter() - started) * 1000,
            )

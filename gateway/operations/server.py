"""Serving the app with uvicorn: in the foreground (the CLI) or on a thread (tests, benchmarks).

SIGTERM drains: uvicorn stops accepting connections, lets running requests finish for up
to `shutdown_timeout` seconds, cancels what is left, then the lifespan stops the engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import uvicorn

from loragate.engine import AsyncLLMEngine
from loragate.gateway.app import create_app
from loragate.gateway.operations.access_log import AccessLog
from loragate.gateway.operations.http_limits import timed_protocol
from loragate.gateway.operations.settings import GatewaySettings
from loragate.registry import RegistryStore


def build_server(
    settings: GatewaySettings,
    engine: AsyncLLMEngine | None = None,
    store: RegistryStore | None = None,
) -> uvicorn.Server:
    config = uvicorn.Config(
        AccessLog(create_app(settings, engine, store)),
        host=settings.host,
        port=settings.port,
        lifespan="on",
        access_log=False,  # AccessLog writes one line per request instead
        log_config=None,  # keep the process's logging setup
        timeout_graceful_shutdown=settings.shutdown_timeout,
        timeout_keep_alive=settings.keep_alive_seconds,
        http=timed_protocol(
            settings.header_timeout_seconds,
            settings.body_timeout_seconds,
            settings.max_connections,
        ),
    )
    return uvicorn.Server(config)


def bound_url(server: uvicorn.Server) -> str:
    """http://host:port the server listens on (the real port when 0 was asked for)."""
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


def serve(settings: GatewaySettings, announce: Callable[[str], None] = print) -> bool:
    """Serve until SIGINT/SIGTERM; False if the app failed to start."""
    server = build_server(settings)

    async def main() -> None:
        async def announce_when_started() -> None:
            while not server.started:
                await asyncio.sleep(0.05)
            announce(f"loragate listening on {bound_url(server)}")

        watcher = asyncio.create_task(announce_when_started())
        try:
            await server.serve()
        finally:
            watcher.cancel()

    asyncio.run(main())
    return server.started


class BackgroundServer:
    """The whole server (real uvicorn, real sockets) on a thread; `url` once started."""

    def __init__(
        self,
        settings: GatewaySettings,
        engine: AsyncLLMEngine | None = None,
        store: RegistryStore | None = None,
        start_timeout: float = 600.0,
    ):
        self.server = build_server(settings, engine, store)
        self.app = self.server.config.app.app  # the Litestar app inside the access log
        self._thread = threading.Thread(target=self.server.run, name="loragate-http", daemon=True)
        self._start_timeout = start_timeout
        self.url = ""

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + self._start_timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server failed to start (see the log)")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not start in time")
            time.sleep(0.02)
        self.url = bound_url(self.server)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

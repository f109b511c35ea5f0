"""Serving the app with uvicorn: in the foreground (the CLI) or on a thread (tests, benchmarks).

SIGTERM drains: uvicorn stops accepting connections, lets running requests finish for up
to `shutdown_timeout` seconds, cancels what is left, then the lifespan stops the engine.

The ports are bound before anything else (a port in use fails in a second, not after the
model loaded) and listened on only once the lifespan has started the engine.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable

import uvicorn

from loragate.engine import EngineClient
from loragate.gateway.assembly.app import create_app
from loragate.gateway.assembly.head_requests import HeadAsGet
from loragate.gateway.assembly.http_limits import timed_protocol
from loragate.gateway.observation.access_log import AccessLog
from loragate.gateway.observation.metrics_server import MetricsServer
from loragate.gateway.settings import GatewaySettings
from loragate.registry import RegistryStore

log = logging.getLogger(__name__)


class _NotUvicornError(logging.Filter):
    """uvicorn logs its INFO lines ("Started server process") as `uvicorn.error`; they are
    no errors, so they are named `uvicorn` here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error" and record.levelno < logging.WARNING:
            record.name = "uvicorn"
        return True


logging.getLogger("uvicorn.error").addFilter(_NotUvicornError())


def build_server(
    settings: GatewaySettings,
    engine: EngineClient | None = None,
    store: RegistryStore | None = None,
) -> uvicorn.Server:
    app = create_app(settings, engine, store)
    config = uvicorn.Config(
        AccessLog(HeadAsGet(app)),
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
    server = uvicorn.Server(config)
    server.loragate_app = app  # the Litestar app inside the access log and HEAD wrappers
    server.loragate_socket = bind(settings.host, settings.port, "port")
    server.loragate_metrics = None
    if settings.metrics_port is not None:
        sock = bind(settings.host, settings.metrics_port, "metrics_port")
        server.loragate_metrics = MetricsServer(app, settings.metrics_key, sock)
    return server


class PortInUseError(OSError):
    """A port to listen on is taken (or not ours to bind)."""


def bind(host: str, port: int, what: str) -> socket.socket:
    """A bound (not yet listening) TCP socket, or PortInUseError naming the flag."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        flag = "--" + what.replace("_", "-")
        raise PortInUseError(f"cannot listen on {host}:{port} ({flag}): {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


async def serve_all(server: uvicorn.Server) -> None:
    """The API server on its bound socket, and the metrics server (if any) once it is up."""
    metrics: MetricsServer | None = server.loragate_metrics

    async def when_started() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        log.info("accepting connections on %s", bound_url(server))
        if metrics is not None:
            await metrics.start()
            log.info("metrics on %s", metrics_url(server))

    starter = asyncio.create_task(when_started())
    try:
        await server.serve(sockets=[server.loragate_socket])
    finally:
        starter.cancel()
        if metrics is not None:
            if metrics.server.started:
                await metrics.stop()
            else:
                metrics.sock.close()


def bound_url(server: uvicorn.Server) -> str:
    """http://host:port the server listens on (the real port when 0 was asked for)."""
    host, port = server.loragate_socket.getsockname()[:2]
    return f"http://{host}:{port}"


def metrics_url(server: uvicorn.Server) -> str | None:
    """http://host:port/metrics of --metrics-port, or None without one."""
    if server.loragate_metrics is None:
        return None
    host, port = server.loragate_metrics.sock.getsockname()[:2]
    return f"http://{host}:{port}/metrics"


def serve(settings: GatewaySettings, announce: Callable[[str], None] = print) -> bool:
    """Serve until SIGINT/SIGTERM; False if the app failed to start (a port in use, or
    --replicas without Ray Serve installed, fails here, before the model loads)."""
    if settings.replicated:
        from loragate.gateway.replicas.availability import RayNotInstalledError, require_ray_serve

        try:
            require_ray_serve()
        except RayNotInstalledError as exc:
            log.error("%s", exc)
            return False
    try:
        server = build_server(settings)
    except PortInUseError as exc:
        log.error("%s", exc)
        return False

    async def main() -> None:
        async def announce_when_started() -> None:
            while not server.started:
                await asyncio.sleep(0.05)
            announce(f"loragate listening on {bound_url(server)}")
            if server.loragate_metrics is not None:
                announce(f"metrics on {metrics_url(server)}")

        watcher = asyncio.create_task(announce_when_started())
        try:
            await serve_all(server)
        finally:
            watcher.cancel()

    asyncio.run(main())
    return server.started


class BackgroundServer:
    """The whole server (real uvicorn, real sockets) on a thread; `url` once started."""

    def __init__(
        self,
        settings: GatewaySettings,
        engine: EngineClient | None = None,
        store: RegistryStore | None = None,
        start_timeout: float = 600.0,
    ):
        self.server = build_server(settings, engine, store)
        self.app = self.server.loragate_app
        self._thread = threading.Thread(target=self._run, name="loragate-http", daemon=True)
        self._start_timeout = start_timeout
        self.url = ""
        self.metrics_url: str | None = None

    def _run(self) -> None:
        asyncio.run(serve_all(self.server))

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
        self.metrics_url = metrics_url(self.server)
        if self.metrics_url is not None:
            while not self.server.loragate_metrics.server.started:  # starts right after
                if not self._thread.is_alive():
                    raise RuntimeError("the metrics server failed to start (see the log)")
                time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""`--metrics-port`: GET /metrics on a port of its own, with no tenant key (vLLM-style), so
Prometheus scrapes without holding the admin key. It answers nothing else, and needs
`--metrics-key` when one is set (a scraper's key: it opens metrics and nothing more).

It is a bare ASGI app over the API app's state, served by a second uvicorn server on the
same event loop, started once the API server is up and stopped with it.
"""

from __future__ import annotations

import hmac
import json
import socket

import uvicorn

from loragate.gateway.observation.metrics import CONTENT_TYPE


class MetricsApp:
    def __init__(self, api, key: str | None):
        self.api = api  # the Litestar app: its state holds the metrics report once started
        self.key = key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            return await _send(send, 404, "not found: this port serves only GET /metrics")
        if scope["method"] not in ("GET", "HEAD"):
            return await _send(send, 405, "method not allowed: GET /metrics", allow="GET")
        if self.key is not None and not _holds(scope, self.key):
            return await _send(send, 401, "this port needs the metrics key", auth=True)
        services = getattr(self.api.state, "services", None)  # set once the app started
        if services is None:
            return await _send(send, 503, "the server is starting")
        body = await services.metrics_report.render()
        await send_bytes(send, 200, body, CONTENT_TYPE, head=scope["method"] == "HEAD")


def _holds(scope, key: str) -> bool:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(
                token.strip().encode(), key.encode()
            )
    return False


async def _send(send, status: int, message: str, allow: str = "", auth: bool = False):
    body = json.dumps({"error": {"message": message, "code": status}}).encode()
    extra = [(b"allow", allow.encode())] if allow else []
    if auth:
        extra.append((b"www-authenticate", b"Bearer"))
    await send_bytes(send, status, body, "application/json", extra)


async def send_bytes(send, status, body: bytes, media: str, extra=(), head=False) -> None:
    headers = [(b"content-type", media.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra)})
    await send({"type": "http.response.body", "body": b"" if head else body})


class MetricsServer:
    """A uvicorn server for MetricsApp on an already bound socket; no lifespan, no signals
    (the API server owns both)."""

    def __init__(self, api, key: str | None, sock: socket.socket):
        config = uvicorn.Config(
            MetricsApp(api, key), lifespan="off", access_log=False, log_config=None
        )
        self.server = uvicorn.Server(config)
        self.sock = sock

    async def start(self) -> None:
        self.server.config.load()
        self.server.lifespan = self.server.config.lifespan_class(self.server.config)
        await self.server.startup(sockets=[self.sock])

    async def stop(self) -> None:
        await self.server.shutdown(sockets=[self.sock])

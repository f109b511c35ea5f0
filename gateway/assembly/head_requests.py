"""HEAD wherever GET works: the HTTP rule (RFC 9110, 9.3.2) that Litestar leaves to each route.

Litestar answers HEAD only on routes that declare a HEAD handler, so `HEAD /metrics` or
`HEAD /v1/models` got 405, and load generators and uptime probes that check a route with
HEAD first refuse the server. This wrapper runs a HEAD request as the GET it stands for and
sends the same status and headers with no body. A route that has no GET still answers 405.
"""

from __future__ import annotations


class HeadAsGet:
    """ASGI wrapper around the whole app: HEAD runs the GET route, its body dropped."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def send_headers_only(message):
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        return await self.app({**scope, "method": "GET"}, receive, send_headers_only)

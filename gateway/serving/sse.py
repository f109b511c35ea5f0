"""Server-sent events: one `data:` line per JSON body, and the response that carries them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

DONE = b"data: [DONE]\n\n"
EVENT_STREAM = "text/event-stream"


def sse_event(body) -> bytes:
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


class EventStream(Stream):
    """A `Stream` that is always sent as `text/event-stream`.

    Litestar's `Stream` lets the route handler's media type win over its own, and a route
    that answers JSON or a stream (`-> ChatCompletionResponse | Stream`) has JSON as its
    media type: strict SSE clients (aiperf) refuse such a stream. Here the stream's own type
    is the one sent, whatever the handler declares.
    """

    def to_asgi_response(self, *args, **kwargs):
        kwargs["media_type"] = EVENT_STREAM
        return super().to_asgi_response(*args, **kwargs)


def sse_response(events: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]]) -> Stream:
    """`cleanup` runs after the stream ends, normally or because the client went away.

    Litestar cancels the event iterator on disconnect and then still runs the background
    task, so the engine request is aborted even if the iterator was parked on a send.
    """
    return EventStream(
        events,
        media_type=EVENT_STREAM,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(cleanup),
    )

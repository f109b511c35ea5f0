"""Server-sent events: one `data:` line per JSON body, and the response that carries them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from litestar.background_tasks import BackgroundTask
from litestar.response import Stream

DONE = b"data: [DONE]\n\n"


def sse_event(body) -> bytes:
    return b"data: " + msgspec.json.encode(body) + b"\n\n"


def sse_response(events: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]]) -> Stream:
    """`cleanup` runs after the stream ends, normally or because the client went away.

    Litestar cancels the event iterator on disconnect and then still runs the background
    task, so the engine request is aborted even if the iterator was parked on a send.
    """
    return Stream(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(cleanup),
    )

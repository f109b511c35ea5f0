"""Stop work the moment the client hangs up.

Streams are handled by Litestar (it cancels the stream when the client disconnects); a
plain request is watched here while it waits for the engine, so a client that gives up on a
long completion frees its KV blocks at once instead of after the last token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from loragate.gateway.errors import APIError

T = TypeVar("T")


class ClientDisconnectedError(APIError):
    status_code = 499
    error_type = "client_closed_request"


async def until_disconnect(receive, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelling it (and raising) if an http.disconnect arrives first."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.create_task(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise ClientDisconnectedError("the client disconnected")
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()


async def _wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

"""Results crossing from the engine thread to an asyncio loop, and request ids checked."""

from __future__ import annotations

import asyncio


def check_request_id(request_id) -> None:
    try:
        hash(request_id)
    except TypeError:
        ok = False
    else:
        ok = request_id is not None
    if not ok:
        raise TypeError(f"request_id must be hashable (a str or int, say), got {request_id!r}")


def drop_result(future: asyncio.Future) -> None:
    """A load given up on: its late result, or error, goes nowhere (and is not logged)."""
    if not future.cancelled():
        future.exception()


def resolve(loop, future: asyncio.Future, result=None, error: BaseException | None = None):
    def settle():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    loop.call_soon_threadsafe(settle)

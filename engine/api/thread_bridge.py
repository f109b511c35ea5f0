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


def deliver(loop: asyncio.AbstractEventLoop, fn, *args) -> bool:
    """Run ``fn(*args)`` on ``loop``; False when that loop has closed. A caller whose event
    loop ended without waiting for its requests is gone, and only its own requests end with
    it: the engine thread that serves every other caller goes on."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if loop.is_closed():
            return False
        raise
    return True


def resolve(loop, future: asyncio.Future, result=None, error: BaseException | None = None) -> bool:
    """Settle ``future`` on its loop; False when the loop has closed."""

    def settle():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    return deliver(loop, settle)

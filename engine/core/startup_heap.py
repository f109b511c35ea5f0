"""Python's cyclic garbage collector and the engine's steps: the startup heap is frozen.

A full collection walks every tracked object of the process while holding the GIL, and the
engine thread needs the GIL between the step's torch calls. A serving process holds half a
million objects before its first request (torch, transformers, Litestar, Ray, the model's
modules): one full collection of that heap took 230 ms on a 2-core Xeon, and one landing
inside a step stalled every stream by that much, three times their median gap between two
tokens (the cold-start test's failure in CI). vLLM's engine core freezes its heap once it
has started, for the same reason.

So a running AsyncLLMEngine keeps everything that existed when it started in the permanent
generation (``gc.freeze``): collections walk only what was made since (requests, outputs,
adapter weights), and reference counting still frees the rest as always. When the last
engine of the process shuts down the heap is unfrozen again, so an engine that is dropped
afterwards (its objects form cycles) and any garbage that was frozen with it are collected
as usual. No collection runs here: freezing and unfreezing are constant-time.

The collector and its permanent generation belong to the process, so the count of running
engines does too.

Loading the weights also leaves the C heap holding what it freed: reading a file of blocks
makes and drops hundreds of megabyte-sized buffers, and glibc keeps freed chunks below its
(self-raising) mmap threshold in the heap for reuse, about 50 MB after the default model's
Q4_1 file. `release_freed_heap` hands them back to the system once the engine is built
(glibc's `malloc_trim`; nothing elsewhere), so the process's resident memory is what it holds.
"""

from __future__ import annotations

import ctypes
import gc
import threading

_lock = threading.Lock()
_running = 0


def engine_started() -> None:
    """An engine starts stepping: the objects alive now leave the collector's walks (again,
    when another engine froze the heap before: what was made since joins them)."""
    global _running
    with _lock:
        _running += 1
        gc.freeze()


def engine_stopped() -> None:
    """An engine stopped: when it was the last one running, the heap is collectable again."""
    global _running
    with _lock:
        if _running == 0:
            return
        _running -= 1
        if _running == 0:
            gc.unfreeze()


def release_freed_heap() -> None:
    """Give the C heap's free memory back to the system (glibc only: a no-op elsewhere)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)

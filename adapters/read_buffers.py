"""Memory that adapter reads fill, kept from one load to the next.

A weights file is read into one anonymous mapping (adapters/loader.py, `hashed_read`), its
tensors parsed as views of it, and on a CPU copied into the stacks the slots read. A fresh
mapping each load makes the kernel fault every page in again: 19,000 faults for a 78 MB
rank-64 adapter, 40-60 ms of its 170-250 ms load on a 2-core VM (BENCHMARKS.md, issue 47),
as much as hashing it. So a load borrows a mapping kept from an earlier one, and gives it
back when it ends, kept only where nothing made from that read still views it: an adapter
whose modules are not all stacked (a rank_pattern, layers out of one run) or whose vocab
extras are views keeps reading its mapping, so that mapping stays with it and the next load
takes another. Whether anything still views a mapping is asked of the mapping itself: an
mmap refuses to resize while any buffer of it is exported (a memoryview, a tensor made by
`torch.frombuffer`), so a mapping some tensor still reads is never handed to another read.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Mappings kept at once (one per loader thread, adapters' reads being one at a time on each)
# and the largest kept: a larger read's mapping is let go, as an adapter with whole
# embedding matrices would otherwise keep hundreds of MB outside every tier's budget.
KEPT_BUFFERS = 2
MAX_KEPT_BYTES = 256 * 2**20


class ReadBuffers:
    """Anonymous mappings for adapter reads, lent for one load (`lend`) and kept after it
    where nothing still views them. Thread-safe; counts the reads that reused one."""

    def __init__(self, kept: int = KEPT_BUFFERS, max_bytes: int = MAX_KEPT_BYTES):
        self.kept, self.max_bytes = kept, max_bytes
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.reused = 0

    @contextmanager
    def lend(self) -> Iterator[Lease]:
        """A lease for one load: every mapping it gives is offered back when it ends."""
        lease = Lease(self)
        try:
            yield lease
        finally:
            for buffer in lease.taken:
                self._give_back(buffer)

    def _take(self, size: int) -> mmap.mmap:
        with self._lock:
            fitting = [buffer for buffer in self._free if len(buffer) >= size]
            if fitting:
                buffer = min(fitting, key=len)
                self._free.remove(buffer)
                self.reused += 1
                return buffer
        return mmap.mmap(-1, size)

    def _give_back(self, buffer: mmap.mmap) -> None:
        if len(buffer) > self.max_bytes or not unviewed(buffer):
            return  # let go: its views (if any) keep it alive as long as they need it
        with self._lock:
            self._free.append(buffer)
            self._free.sort(key=len)
            while len(self._free) > self.kept:
                self._free.pop(0).close()  # the smallest: nothing views it


class Lease:
    """The mappings one load took (`take`), handed back by `ReadBuffers.lend`."""

    def __init__(self, buffers: ReadBuffers):
        self._buffers = buffers
        self.taken: list[mmap.mmap] = []

    def take(self, size: int) -> mmap.mmap:
        """A mapping of at least ``size`` bytes (size >= 1), kept or new; what it held
        before is overwritten by the read."""
        buffer = self._buffers._take(size)
        self.taken.append(buffer)
        return buffer


def unviewed(buffer: mmap.mmap) -> bool:
    """Whether no memoryview or tensor of ``buffer`` is alive (resizing it to its own size
    is refused while one is)."""
    try:
        buffer.resize(len(buffer))
    except BufferError:
        return False
    return True

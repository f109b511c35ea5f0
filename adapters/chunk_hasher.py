"""The sha256 of a file's chunks, taken on a thread of its own while the next chunk is read.

An adapter read (adapters/loader.py) reads its weights file in chunks and hashes each one.
Done in turn on one thread, a 78 MB rank-64 adapter took 60 ms to read and 46 ms to hash
(AMD EPYC, 2 cores, 2026-11-27): both leave the GIL free (a file's `readinto`, and hashlib
over more than 2 KB), so with a core to spare the hash of one chunk runs while the next is
read, and the read costs about what its longer half costs. Chunks are hashed in the order
they are handed in, each from the caller's buffer, which must not change until `hexdigest`
returns. Where steps run beside the read and it is paced (adapters/pacing.py), the caller
hashes in line instead: a second thread would take twice the share of the cores the pacing
gives a load.
"""

from __future__ import annotations

import hashlib
import queue
import threading

_DONE = None


class ChunkHasher:
    """sha256 over the chunks given to `update`, on a thread of its own when ``threaded``."""

    def __init__(self, threaded: bool):
        self._digest = hashlib.sha256()
        self._chunks: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        if threaded:
            self._chunks = queue.SimpleQueue()
            self._thread = threading.Thread(
                target=self._run, name="loragate-adapter-hash", daemon=True
            )
            self._thread.start()

    def update(self, chunk: memoryview) -> None:
        """Hash ``chunk`` after the chunks given before it."""
        if self._chunks is None:
            self._digest.update(chunk)
        else:
            self._chunks.put(chunk)

    def hexdigest(self) -> str:
        """The digest of every chunk given, once the thread has hashed them all."""
        self.close()
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()

    def close(self) -> None:
        """Stop the thread after the chunks given so far (a read that failed calls this so
        no thread outlives it); idempotent."""
        if self._thread is not None:
            self._chunks.put(_DONE)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not _DONE:
            if self._error is None:
                try:
                    self._digest.update(chunk)
                except BaseException as exc:  # handed to the reader by hexdigest
                    self._error = exc

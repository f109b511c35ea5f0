"""The bounded waiting queue: how many sequences the gateway lets into the engine at once.

The engine batches `max_num_seqs` sequences; up to `max_queue` more may wait behind them.
Past that a request is refused with 429 and Retry-After at once, so a burst cannot grow
every other request's latency without bound.
"""

from __future__ import annotations

from loragate.gateway.errors import QueueFullError


class Admission:
    def __init__(self, max_running: int, max_queue: int, retry_after_seconds: int = 1):
        self.max_running = max_running
        self.max_queue = max_queue
        self.retry_after_seconds = retry_after_seconds
        self.in_flight = 0
        self.rejected = 0

    @property
    def capacity(self) -> int:
        return self.max_running + self.max_queue

    @property
    def waiting(self) -> int:
        """Admitted sequences beyond what the engine can run at once."""
        return max(0, self.in_flight - self.max_running)

    def admit(self, num_seqs: int) -> None:
        """Count `num_seqs` sequences in, or raise QueueFullError (429) changing nothing."""
        if self.in_flight + num_seqs > self.capacity:
            self.rejected += 1
            raise QueueFullError(
                f"the server is at capacity ({self.max_running} running and {self.max_queue} "
                "queued sequences); retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_seconds)},
            )
        self.in_flight += num_seqs

    def release(self, num_seqs: int) -> None:
        self.in_flight -= num_seqs
        assert self.in_flight >= 0, "admission released more sequences than it admitted"

"""Copies into device slots beside the step that admits their adapter (a GPU's slots).

On a CUDA device an adapter comes into its slot as a copy (adapters/slots.py), on the step
that admits its first request. Issued on the step's own stream from pageable host memory,
the copy holds the host until it ends (a rank-64 adapter on every projection of the default
model is 78 MB) and every kernel of the step queues behind it. Here the copy runs on a side
stream, from pinned memory (the loader stacks a GPU's adapters there), a layer at a time,
each layer's end marked by an event; the step's stream waits for a layer's event only when
the forward reaches that layer (``ready``), so the copy of layer l runs beside the compute
of the layers before it, the admitted request's prefill included. vLLM's PRs 31941 (layer
by layer) and 41785 (a side stream) and SGLang's 15512 pipeline their loads the same way.

Before its copy the side stream waits for the step's stream: kernels still queued there may
read the slot's old rows. What a graph replays waits for every layer first (``wait_all``):
a captured graph cannot wait on an event recorded outside it. Where there is no CUDA stream
(the CPU, whose slots mostly borrow the CPU tier's rows in place) a write runs at once, all
layers in one pass, and nothing waits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class Streams(Protocol):
    """The stream operations a pipelined copy needs (CudaStreams; tests record them)."""

    def side_after_step(self) -> Any:
        """A context in which work runs on the side stream, after the step's queued work."""

    def mark(self) -> Any:
        """An event marking the side stream's work so far."""

    def wait(self, event: Any) -> None:
        """The step's stream waits for ``event`` before its next work."""


class CudaStreams:
    """A side stream on one CUDA device, beside the device's current stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device)

    def side_after_step(self):
        self.side.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.side)

    def mark(self):
        event = torch.cuda.Event()
        event.record(self.side)
        return event

    def wait(self, event) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)


class SlotCopies:
    """Runs slot writes layer by layer on a side stream, and makes the step wait for each
    layer only where it reads it; without streams, runs them at once."""

    def __init__(self, num_layers: int, streams: Streams | None = None):
        self.num_layers = num_layers
        self.streams = streams
        self._pending: list[Any] = [None] * num_layers  # layer -> its last copy's event

    @classmethod
    def for_device(cls, num_layers: int, device: torch.device) -> SlotCopies:
        """Side-stream copies on a CUDA device, immediate ones elsewhere."""
        streams = CudaStreams(device) if device.type == "cuda" else None
        return cls(num_layers, streams)

    @property
    def pending(self) -> list[int]:
        """The layers whose last copy the step has not waited for yet."""
        return [layer for layer, event in enumerate(self._pending) if event is not None]

    def run(self, write_layers: Callable[[range], None]) -> None:
        """Call ``write_layers`` over all layers: at once, or a layer a call on the side
        stream, each layer's event kept for ``ready``."""
        if self.streams is None:
            write_layers(range(self.num_layers))
            return
        with self.streams.side_after_step():
            for layer in range(self.num_layers):
                write_layers(range(layer, layer + 1))
                self._pending[layer] = self.streams.mark()

    def ready(self, layer: int) -> None:
        """The step's stream waits for ``layer``'s copy, if one is pending."""
        event = self._pending[layer]
        if event is not None:
            self.streams.wait(event)
            self._pending[layer] = None

    def wait_all(self) -> None:
        for layer in range(self.num_layers):
            self.ready(layer)

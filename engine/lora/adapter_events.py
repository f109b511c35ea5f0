"""Events for the server when the weights behind an adapter's name change.

An adapter's files may be changed in place: the engine admits each request under the
weights its files hold then. When it admits a request for a name under weights (sha256)
other than those it last admitted for that name, the first time it admits one for a name
included, it tells every listener once, with an `AdapterWeightsChanged`. The gateway
listens (its registry record follows the weights served). The first output of a request
for that name waits until the listeners are done, so a client that sees the answer sees
the record that goes with it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from loragate.adapters import LoRARequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterWeightsChanged:
    """A request for ``lora_request`` was admitted under weights ``sha256``; the last one
    admitted for its name had ``previous_sha256`` (None: the first this engine saw)."""

    lora_request: LoRARequest
    sha256: str
    previous_sha256: str | None


WeightsListener = Callable[[AdapterWeightsChanged], Awaitable[None]]


class AdapterEvents:
    """The weights last admitted under each name, and the listeners told when they change.

    `admitted` and `settled` run on the event loop the requests stream on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._admitted: dict[str, str] = {}  # name -> sha256 of the weights last admitted
        self._listeners: list[WeightsListener] = []
        self._telling: dict[str, asyncio.Task] = {}  # name -> listeners still at work

    def subscribe(self, listener: WeightsListener) -> Callable[[], None]:
        """Tell ``listener`` of every change from now on; call what this returns to stop."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def admitted(self, lora: LoRARequest, sha256: str) -> AdapterWeightsChanged | None:
        """A request for ``lora`` is admitted under ``sha256``: the event, if that is a
        change for its name, with the listeners started on the running loop."""
        name = lora.lora_name
        with self._lock:
            previous = self._admitted.get(name)
            if previous == sha256:
                return None
            self._admitted[name] = sha256
        event = AdapterWeightsChanged(lora, sha256, previous)
        if self._listeners:
            task = asyncio.get_running_loop().create_task(self._tell(event))
            self._telling[name] = task
            task.add_done_callback(lambda done: self._forget(name, done))
        return event

    async def settled(self, lora: LoRARequest) -> None:
        """Return once the listeners told of a change under ``lora``'s name are done."""
        task = self._telling.get(lora.lora_name)
        if task is not None:
            await asyncio.wait([task])  # shielded: a listener's error is logged, not raised

    async def _tell(self, event: AdapterWeightsChanged) -> None:
        for listener in list(self._listeners):
            try:
                await listener(event)
            except Exception:  # noqa: BLE001 - a listener's failure never fails a request
                log.exception("adapter %s: a weights listener failed", event.lora_request.lora_name)

    def _forget(self, name: str, task: asyncio.Task) -> None:
        if self._telling.get(name) is task:
            del self._telling[name]

"""The one way the gateway reaches the registry store.

Every call through `RegistrySeam` records whether the store answered (`StoreHealth`), and an
outage (`RegistryUnavailable`, whatever the backend) becomes one `RegistryDownError`, which
the HTTP layer answers with 503 and Retry-After. Callers that can serve without the store
(known keys, quotas failing open, usage waiting to be written) catch that one error.

Calls on the request path skip the store while it is known to be down (a silent Redis
would otherwise cost each request a socket timeout); the sync loop keeps probing it and
flips this back once it answers.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from loragate.gateway.errors import RegistryDownError
from loragate.registry import ChangeEvent, RegistryStore, RegistryUnavailable

log = logging.getLogger(__name__)


class StoreHealth:
    def __init__(self, where: str):
        self.where = where
        self.reachable = True
        self.error: str | None = None
        self.down_since: float | None = None
        self.watching = False

    @property
    def down(self) -> bool:
        return not self.reachable

    def succeeded(self) -> None:
        if not self.reachable:
            log.warning(
                "registry store at %s is reachable again (down %.1f s)",
                self.where,
                time.time() - (self.down_since or time.time()),
            )
        self.reachable = True
        self.error = None
        self.down_since = None

    def failed(self, exc: BaseException) -> None:
        if self.reachable:
            log.error("%s (serving what this replica knows; retrying)", exc)
            self.down_since = time.time()
        self.reachable = False
        self.watching = False
        self.error = str(exc)


class RegistrySeam:
    """The store's own methods, each recorded in `health`; RegistryDownError for an outage."""

    def __init__(self, store: RegistryStore, where: str | None = None):
        self.store = store
        self.where = where or getattr(store, "where", "memory")
        self.health = StoreHealth(self.where)

    def __getattr__(self, name: str):
        method = getattr(self.store, name)
        if not inspect.iscoroutinefunction(method):
            return method

        @functools.wraps(method)
        async def recorded(*args, **kwargs):
            try:
                result = await method(*args, **kwargs)
            except RegistryUnavailable as exc:
                raise self._down(exc) from exc
            self.health.succeeded()
            return result

        return recorded

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[ChangeEvent]]:
        """The store's change feed; losing it (on entry or while reading) is RegistryDownError."""
        try:
            async with self.store.watch() as events:
                yield events
        except RegistryUnavailable as exc:
            raise self._down(exc) from exc

    def _down(self, exc: RegistryUnavailable) -> RegistryDownError:
        self.health.failed(exc)
        return RegistryDownError()

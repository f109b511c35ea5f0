"""Whether the registry store answers, as every part of the gateway last saw it.

Calls on the request path skip the store while it is known to be down (a silent Redis
would otherwise cost each request a socket timeout); the sync loop keeps probing it and
flips this back once it answers.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from loragate.registry import RegistryUnavailable

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

    @contextmanager
    def noting(self):
        """Record the outcome of the store calls inside; RegistryUnavailable propagates."""
        try:
            yield
        except RegistryUnavailable as exc:
            self.failed(exc)
            raise
        self.succeeded()

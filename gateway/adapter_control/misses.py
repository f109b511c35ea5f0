"""What the registry store was asked for and did not have, remembered by the adapter catalog.

A replica reads an adapter from the store the first time a request names it; a name the
store does not have would otherwise cost a store read on every request that names it.
The catalog remembers such misses (adapter keys, and names with no public adapter) until a
change from the store names them: the sync forgets a miss for every changed key, so a
registration anywhere is seen at once. Bounded: past `limit` entries it starts over.
"""

from __future__ import annotations

from loragate.registry import split_adapter_key


class Misses:
    def __init__(self, limit: int = 100_000):
        self.limit = limit
        self._keys: set[str] = set()
        self._public: set[str] = set()

    def has_key(self, key: str) -> bool:
        return key in self._keys

    def has_public(self, name: str) -> bool:
        return name in self._public

    def add_key(self, key: str) -> None:
        self._room()
        self._keys.add(key)

    def add_public(self, name: str) -> None:
        self._room()
        self._public.add(name)

    def forget(self, key: str) -> None:
        """The store changed `key`: neither it nor its name's public adapter is known missing."""
        self._keys.discard(key)
        try:
            self._public.discard(split_adapter_key(key)[1])
        except ValueError:
            pass

    def clear(self) -> None:
        self._keys.clear()
        self._public.clear()

    def __len__(self) -> int:
        return len(self._keys) + len(self._public)

    def _room(self) -> None:
        if len(self) >= self.limit:
            self.clear()

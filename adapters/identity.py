"""An adapter is its weights: the content hash of its files, and a cheap way to trust it again.

Both adapter tiers (CPU memory, device slots) and the engine's prefix cache are keyed by a
``WeightsIdentity``: the sha256 of ``adapter_model.safetensors`` and of
``adapter_config.json`` (its alpha and patterns change what the weights compute). Files
that change are a new identity everywhere, so no tier can hand back stale weights or KV.

Hashing on every request would read every adapter's files on the hot path, so ``IdentityBook``
remembers, per directory, the identity last hashed and the files' ``FilesStamp`` (device,
inode, size, mtime and ctime of both files) taken before they were read. An unchanged stamp
means unchanged files; any write, replace (a new inode) or ``touch`` changes it. A stamp whose
times are within ``RACY_NS`` of the moment it was taken is not trusted (as git does with its
index): a write in the same clock tick could leave every field as it was. An engine keeps one
book: its adapter tiers' reads record what they hashed, and the adapter store's fetcher what
its check of an object hashed (``vouch``), so the first read of a fetched object does not
hash the same bytes again.

The time a stamp is taken at comes from a ``StampClock`` handed to whoever stamps
(``IdentityBook``, the CPU tier's reads, the store's checks): the system's by default, one that
tests move forward instead of sleeping out the racy window.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# File times this close to the stat itself may hide a later write in the same clock tick
# (coarse kernel clocks, 2 s on FAT): such a stamp is re-hashed rather than trusted.
RACY_NS = 2_000_000_000


class StampClock:
    """The wall clock stamps are taken by, in nanoseconds since the epoch: the clock the
    file system writes its times with."""

    def now_ns(self) -> int:
        return time.time_ns()


SYSTEM_CLOCK = StampClock()


@dataclass(frozen=True)
class WeightsIdentity:
    """What an adapter computes with: the sha256 of its weights file and of its config file."""

    sha256: str
    config_sha256: str

    @property
    def key(self) -> str:
        """One string for both hashes (the prefix cache mixes it into every block's name)."""
        return f"{self.sha256}:{self.config_sha256}"

    def __str__(self) -> str:
        return f"sha256 {self.sha256[:12]} (config {self.config_sha256[:8]})"


@dataclass(frozen=True)
class FilesStamp:
    """``os.stat`` fields of the config and weights files that any change to them moves."""

    config: tuple[int, ...]
    weights: tuple[int, ...]
    taken_ns: int

    def same_files(self, other: FilesStamp) -> bool:
        return self.config == other.config and self.weights == other.weights

    @property
    def trusted(self) -> bool:
        """False while a write in the same clock tick as the stat could go unseen."""
        newest = max(self.config[3], self.config[4], self.weights[3], self.weights[4])
        return self.taken_ns - newest >= RACY_NS


# A vouch: a trusted stamp of an adapter's files and the identity they hashed to when it
# was taken. Files still so stamped are not hashed again (adapters/loader.py).
Vouch = tuple[FilesStamp, WeightsIdentity]


def _fields(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def stamp_files(directory: str | Path, clock: StampClock = SYSTEM_CLOCK) -> FilesStamp | None:
    """The stamp of an adapter directory's two files, taken at ``clock``'s time; None if
    either cannot be stat'ed."""
    root = Path(directory)
    taken = clock.now_ns()
    try:
        return FilesStamp(_fields(root / CONFIG_FILE), _fields(root / WEIGHTS_FILE), taken)
    except OSError:
        return None


class IdentityBook:
    """Directory -> (stamp, identity) as last hashed; thread-safe.

    ``known`` answers from a stat alone when the files are unchanged since they were read.
    ``record`` stores a read's fresh hash and logs, once per change, that a directory's files
    changed. ``vouch`` stores what a store's check hashed: only ``entry`` answers with it until
    a read records the directory, since the files were checked against their object's id but
    never read and validated as an adapter.
    """

    def __init__(self, clock: StampClock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._entries: dict[str, Vouch] = {}
        self._unread: set[str] = set()  # entries a store's check wrote, not yet read
        self._lock = threading.Lock()

    def known(self, directory: str) -> WeightsIdentity | None:
        """The identity of ``directory``'s files if they are provably unchanged since read."""
        with self._lock:
            entry = None if directory in self._unread else self._entries.get(directory)
        if entry is None:
            return None
        stamp, identity = entry
        now = stamp_files(directory, self.clock)
        if now is None or not now.same_files(stamp) or not stamp.trusted:
            return None
        return identity

    def entry(self, directory: str) -> Vouch | None:
        """The stamp and identity last hashed for ``directory`` (no disk access), by a read or
        a store's check: what a read compares its own stamps with before trusting that
        identity (adapters/loader.py ``load_adapter``)."""
        with self._lock:
            return self._entries.get(directory)

    def last(self, directory: str) -> WeightsIdentity | None:
        """The identity last read from ``directory`` (no disk access; may be out of date)."""
        with self._lock:
            entry = None if directory in self._unread else self._entries.get(directory)
        return None if entry is None else entry[1]

    def record(
        self, directory: str, stamp: FilesStamp, identity: WeightsIdentity, name: str
    ) -> None:
        """Remember what a read of ``directory`` hashed to; ``stamp`` was taken before the
        files were read.

        A stamp that was already racy when taken is refreshed once it can be trusted, so
        files that stay unchanged stop being re-hashed.
        """
        with self._lock:
            previous = None if directory in self._unread else self._entries.get(directory)
            self._entries[directory] = (stamp, identity)
            self._unread.discard(directory)
        if previous is not None and previous[1] != identity:
            log.warning(
                "adapter %s: the files in %s changed (%s -> %s); new requests use the new "
                "weights, requests admitted earlier finish with the old ones",
                name,
                directory,
                previous[1],
                identity,
            )

    def vouch(self, directory: str, stamp: FilesStamp, identity: WeightsIdentity) -> None:
        """A store's check hashed ``directory``'s files to ``identity`` while they were
        stamped ``stamp`` (adapters/store.py ``AdapterFetcher``): a read of files still so
        stamped, where that stamp is trusted, need not hash them again."""
        with self._lock:
            self._entries[directory] = (stamp, identity)
            self._unread.add(directory)

    def forget(self, directory: str) -> None:
        """Drop what ``directory`` hashed to (its files were deleted, or no longer checked):
        the next read hashes them."""
        with self._lock:
            self._entries.pop(directory, None)
            self._unread.discard(directory)

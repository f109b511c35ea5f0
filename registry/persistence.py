"""Whether the store's backend keeps the registry over a restart, read from the backend itself.

Redis says so in its own settings: `appendonly yes` (AOF) replays every acknowledged write
after a restart, losing at most what `appendfsync` had not yet put on disk (`always`:
nothing; `everysec`: about the last second, on a power loss or a kernel crash, while a
killed redis-server loses nothing the kernel already holds; `no`: up to the OS's flush
interval, about 30 s). Snapshots alone (`save`) lose every write since the last one; with
neither, a restart loses the whole registry. Where CONFIG is disabled (managed Redis often
renames it) nothing can be read: that is said as such, never guessed.
"""

from __future__ import annotations

import msgspec

# What each appendfsync policy may lose, as the one log line and /health say it.
FSYNC_RISK = {
    "always": "no acknowledged write",
    "everysec": "at most the last second of writes, on a power loss or kernel crash",
    "no": "up to the writes of the OS's last ~30 s, on a power loss or kernel crash",
}


class Persistence(msgspec.Struct, frozen=True, kw_only=True):
    """The backend's persistence, as checked when the store was opened.

    `durable` is True only for an AOF that fsyncs (`always` or `everysec`) or is flushed by
    the OS (`no`); `checked` is False when the backend would not say (CONFIG disabled), and
    then `durable` is False too. `summary` is the sentence an operator reads.
    """

    checked: bool
    durable: bool
    mode: str  # "aof", "snapshots", "none", "memory" or "unknown"
    fsync: str | None = None
    snapshots: str | None = None
    summary: str


def in_memory() -> Persistence:
    return Persistence(
        checked=True,
        durable=False,
        mode="memory",
        summary="in-memory registry: tenants, keys, adapters and usage end with this process",
    )


def unchecked(where: str, why: str) -> Persistence:
    return Persistence(
        checked=False,
        durable=False,
        mode="unknown",
        summary=(
            f"the persistence of the Redis at {where} could not be checked ({why}): make sure "
            "it runs with appendonly yes, or the registry is lost when it restarts"
        ),
    )


def from_redis_config(where: str, config: dict[str, str]) -> Persistence:
    """What `CONFIG GET appendonly appendfsync save` answered, read as persistence."""
    appendonly = config.get("appendonly", "no").strip().lower()
    fsync = config.get("appendfsync", "everysec").strip().lower()
    save = config.get("save", "").strip()
    if appendonly == "yes":
        risk = FSYNC_RISK.get(fsync, f"an unknown share of writes (appendfsync {fsync!r})")
        return Persistence(
            checked=True,
            durable=fsync in FSYNC_RISK,
            mode="aof",
            fsync=fsync,
            snapshots=save or None,
            summary=(
                f"the Redis at {where} is durable: AOF with appendfsync {fsync}; a restart "
                f"keeps the registry, losing {risk}"
            ),
        )
    if save:
        return Persistence(
            checked=True,
            durable=False,
            mode="snapshots",
            snapshots=save,
            summary=(
                f"the Redis at {where} is NOT durable: snapshots only (save {save!r}), so a "
                "restart loses every registry write since the last snapshot; run it with "
                "appendonly yes"
            ),
        )
    return Persistence(
        checked=True,
        durable=False,
        mode="none",
        summary=(
            f"the Redis at {where} is NOT durable: no AOF and no snapshots, so a restart loses "
            "every tenant, key, adapter record and usage count; run it with appendonly yes"
        ),
    )

"""Choosing which adapter leaves a full tier.

The choice is a plain function of plain data, ``choose_victim(candidates, tier)``, so a
plugin (issue 7) can replace least-recently-used without knowing the cache's internals.
Each candidate is one set of weights (the tiers are keyed by content): key (name, int id,
path of the request that used it last, then its weights identity), name, lora_int_id,
path, sha256, tenant, last_used (a logical clock: larger is more recent), uses,
size_bytes, pinned, slot.
``tier`` is "device" or "cpu". The function returns a candidate's key, or its name when
that name is unique among the candidates.
"""

from __future__ import annotations

from collections.abc import Callable

from loragate.plugins.builtin.eviction import lru_victim

__all__ = ["ChooseVictim", "lru_victim", "resolve_victim"]

ChooseVictim = Callable[[list[dict], str], object]


def resolve_victim(choice, candidates: list[dict], tier: str) -> tuple:
    """The key of the candidate ``choice`` designates; a ValueError for a bad answer."""
    if isinstance(choice, dict):
        choice = choice.get("key")
    if isinstance(choice, list):
        choice = tuple(choice)
    keys = [c["key"] for c in candidates]
    if isinstance(choice, tuple) and choice in keys:
        return choice
    if isinstance(choice, str):
        named = [c["key"] for c in candidates if c["name"] == choice]
        if len(named) == 1:
            return named[0]
        if len(named) > 1:
            raise ValueError(
                f"choose_victim returned name {choice!r}, which {len(named)} {tier} candidates "
                "share: return the candidate's key instead"
            )
    raise ValueError(f"choose_victim returned {choice!r}, which is not a {tier} candidate")

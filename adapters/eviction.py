"""Choosing which adapter leaves a full tier.

The choice is a plain function of plain data, ``choose_victim(candidates, tier)``, so a
plugin (issue 7) can replace least-recently-used without knowing the tiers' internals.
Each candidate is one set of weights (the tiers are keyed by content): key (name, int id,
path of the request that used it last, then its weights identity), name, lora_int_id,
path, sha256, tenant, last_used (a logical clock: larger is more recent), uses,
size_bytes, pinned, slot.
``tier`` is "device" or "cpu". The function returns a candidate's key, or its name when
that name is unique among the candidates.
"""

from __future__ import annotations

from collections.abc import Callable

from loragate.plugins.builtin.eviction import lru_victim, victim_key

__all__ = ["ChooseVictim", "chosen_victim", "lru_victim", "victim_key"]

ChooseVictim = Callable[[list[dict], str], object]


def chosen_victim(choose_victim: ChooseVictim, candidates: list[dict], tier: str) -> tuple:
    """The key of the candidate ``choose_victim`` names (a ValueError if none)."""
    try:
        return victim_key(choose_victim(candidates, tier), candidates, tier)
    except ValueError as exc:
        raise ValueError(f"choose_victim {exc}") from None

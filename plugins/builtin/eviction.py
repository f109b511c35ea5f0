"""Built-in adapter eviction: least recently used.

Works on the plain candidate dicts the adapter cache builds (key, name, tenant,
last_used (a logical clock: larger is more recent), uses, size_bytes, pinned, ...).
"""

from __future__ import annotations

from loragate.plugins.markers import hookimpl


def lru_victim(candidates: list[dict], tier: str):
    """The key of the least recently used candidate, skipping pinned ones while any other
    is left; among equally old ones the first listed."""
    if not candidates:
        raise ValueError(f"no {tier} candidates to choose an eviction victim from")
    unpinned = [c for c in candidates if not c.get("pinned", False)] or candidates
    return min(unpinned, key=lambda c: c["last_used"])["key"]


def victim_key(choice, candidates: list[dict], tier: str) -> tuple:
    """The key of the candidate an eviction policy's ``choice`` designates: a key (tuple or
    list), a candidate dict, or a name no other candidate has. A ValueError says why any
    other answer is unusable. The one reading of a policy's answer: the plugin manager's and
    the adapter cache's."""
    if isinstance(choice, dict):
        choice = choice.get("key")
    if isinstance(choice, list):
        choice = tuple(choice)
    keys = [c["key"] for c in candidates]
    if isinstance(choice, tuple) and choice in keys:
        return choice
    named = (
        [c["key"] for c in candidates if c.get("name") == choice] if isinstance(choice, str) else []
    )
    if len(named) == 1:
        return named[0]
    if named:
        raise ValueError(
            f"returned name {choice!r}, which {len(named)} candidates for the {tier} tier "
            "share: return the candidate's 'key'"
        )
    raise ValueError(f"returned {choice!r}, which is not a candidate for the {tier} tier")


class LruEviction:
    """Registered last: any plugin's eviction policy is asked first."""

    @hookimpl(trylast=True)
    def loragate_choose_adapter_victim(self, candidates, tier):
        return lru_victim(candidates, tier)

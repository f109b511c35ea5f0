"""Built-in behaviour, written as plugins and registered ``trylast`` so third parties win."""

from __future__ import annotations

from loragate.plugins.builtin.beam_search import BeamSearchPlugin
from loragate.plugins.builtin.eviction import LruEviction
from loragate.plugins.builtin.fair_preemption import FairPreemption
from loragate.plugins.builtin.fair_share import VirtualTokenCounter
from loragate.plugins.builtin.logit_bias import LogitBias
from loragate.plugins.builtin.ngram_proposer import NgramProposer
from loragate.plugins.builtin.preemption import NewestFirstPreemption
from loragate.plugins.builtin.samplers import BuiltinSamplers
from loragate.plugins.builtin.structured_output import StructuredOutput
from loragate.plugins.builtin.waiting_order import WaitingOrder


def builtin_plugins() -> list[tuple[str, object]]:
    """Fresh (name, plugin) pairs for one manager."""
    return [
        ("builtin.samplers", BuiltinSamplers()),
        ("builtin.lru_eviction", LruEviction()),
        ("builtin.newest_first_preemption", NewestFirstPreemption()),
        ("builtin.waiting_order", WaitingOrder()),
        ("builtin.fair_share", VirtualTokenCounter()),
        ("builtin.fair_preemption", FairPreemption()),
        ("builtin.beam_search", BeamSearchPlugin()),
        ("builtin.structured_output", StructuredOutput()),
        ("builtin.logit_bias", LogitBias()),
        ("builtin.ngram_proposer", NgramProposer()),
    ]

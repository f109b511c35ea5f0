"""Speculative decoding: proposals for decoding rows, verified in the one batched forward.

`config` reads vLLM's `speculative_config`; `speculator` decides each step which rows
speculate and how far, and keeps the acceptance counts; `verify` accepts proposals from the
target's own samples (exact for greedy and sampled rows). Proposers are plugin hooks
(plugins/builtin/ngram_proposer.py is the built-in prompt lookup).
"""

from loragate.engine.speculation.config import SpeculativeConfig, speculative_config_from
from loragate.engine.speculation.speculator import Speculator
from loragate.engine.speculation.verify import verify_drafts

__all__ = ["SpeculativeConfig", "Speculator", "speculative_config_from", "verify_drafts"]

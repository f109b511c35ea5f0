"""Engine state as the plain data plugin hooks take (plugins never see engine objects)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from loragate.engine.core.admission_order import waiting_entries
from loragate.engine.core.fair_share import FairShare, fair_share_key
from loragate.engine.core.sequence import Request, Sequence
from loragate.plugins import PluginError

log = logging.getLogger(__name__)


def model_info(tokenizer, vocab_size: int, eos_token_ids) -> dict:
    """What logits-processor plugins know of the model: structured output needs the
    tokenizer's tokens, logit_bias the vocabulary size."""
    return {
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "eos_token_ids": sorted(eos_token_ids),
    }


def request_info(request: Request) -> dict:
    """Plain data for observer plugins (metering, logging)."""
    finished = request.finished
    return {
        "request_id": request.request_id,
        "lora_name": request.lora_request.lora_name if request.lora_request else None,
        "tenant": request.tenant,
        "num_prompt_tokens": len(request.prompt_token_ids),
        "num_output_tokens": sum(len(s.output_token_ids) for s in request.seqs),
        "finish_reason": request.seqs[0].finish_reason if finished else None,
        "arrival_time": request.arrival_time,
        "finished_time": time.monotonic() if finished else None,
    }


def preemption_candidates(running: list[Sequence]) -> list[dict]:
    """Running sequence groups as plain data, in admission order, for the victim hook."""
    groups: dict[str, dict] = {}
    for order, seq in enumerate(running):
        groups[seq.request.request_id] = {
            "request_id": seq.request.request_id,
            "seq_id": seq.seq_id,
            "arrival_time": seq.request.arrival_time,
            "num_prompt_tokens": seq.prompt_len,
            "num_output_tokens": len(seq.output_token_ids),
            "num_blocks": len(seq.block_table),
            "lora_name": seq.lora_request.lora_name if seq.lora_request else None,
            "admitted_order": order,
        }
    return list(groups.values())


def preemption_victim(choose: Callable[[list[dict]], object]) -> Callable[[list], Sequence]:
    """The scheduler's victim chooser from a plugin-shaped one (plain data in, a request_id
    out): the chosen request's newest running sequence goes."""

    def victim(running: list[Sequence]) -> Sequence:
        chosen = choose(preemption_candidates(running))
        return next(s for s in reversed(running) if s.request.request_id == chosen)

    return victim


def running_groups(running: list[Sequence], step: int, protect_steps: int) -> list[dict]:
    """Running sequence groups as plain data for the preempt-for-waiting hook: the victim
    hook's fields, the tenant and priority, and `protected` (a sequence of the group started
    or resumed running fewer than `protect_steps` steps ago: it may not be chosen)."""
    groups = {g["request_id"]: g for g in preemption_candidates(running)}
    for group in groups.values():
        group["protected"] = False
    for seq in running:
        group = groups[seq.request.request_id]
        group["tenant"] = fair_share_key(seq.request)
        group["priority"] = seq.request.priority
        if step - seq.running_since < protect_steps:
            group["protected"] = True
    return list(groups.values())


def waiting_victim(
    preempt_for_waiting: Callable[[dict, list[dict], dict, str], str | None],
    fair_share: FairShare,
    policy: str,
    protect_steps: int,
) -> Callable[[Sequence, list[Sequence], int], Sequence | None]:
    """The scheduler's `preempt_for(waiting, running, step)` from the plugin-shaped hook
    (plain data in, a request_id or None out): the chosen request's newest running
    sequence. A plugin that fails is logged and nothing is preempted that step."""

    def choose(waiting: Sequence, running: list[Sequence], step: int) -> Sequence | None:
        try:
            chosen = preempt_for_waiting(
                waiting_entries([waiting], fair_share.prompt_token_cost)[0],
                running_groups(running, step, protect_steps),
                fair_share.tenants(),
                policy,
            )
        except PluginError:
            log.exception("preempting for a waiting request failed; none preempted this step")
            return None
        if chosen is None:
            return None
        return next(s for s in reversed(running) if s.request.request_id == chosen)

    return choose

"""Engine state as the plain data plugin hooks take (plugins never see engine objects)."""

from __future__ import annotations

import time
from collections.abc import Callable

from loragate.engine.sequence import Request, Sequence


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

"""An example loragate plugin: one small file, no engine internals.

- Sampler "logit_bias_greedy": the most likely token after adding each request's
  ``sampler_args["bias"]`` ({token_id: value}, OpenAI's logit_bias) to its logits.
- Adapter eviction: the largest adapter leaves first (pinned ones last; among equal sizes
  the least recently used), which frees the most memory per eviction.

Installed, it is found through the ``loragate.plugins`` entry point named "example".
"""

from __future__ import annotations

import torch

from loragate.plugins import hookimpl


def logit_bias_greedy(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    """argmax(logits + bias) per row; a bias on an id outside the vocabulary is an error."""
    vocab = logits.shape[1]
    biased = logits.clone()
    for row, row_args in enumerate(args):
        for token, value in (row_args.get("bias") or {}).items():
            token_id = int(token)  # JSON object keys arrive as strings
            if not 0 <= token_id < vocab:
                raise ValueError(f"bias token id {token_id} is outside the vocabulary [0, {vocab})")
            biased[row, token_id] += float(value)
    return torch.argmax(biased, dim=-1)


@hookimpl
def loragate_samplers():
    return {"logit_bias_greedy": logit_bias_greedy}


@hookimpl
def loragate_choose_adapter_victim(candidates, tier):
    """Largest first: unpinned before pinned, then bigger, then least recently used."""
    victim = min(candidates, key=lambda c: (c["pinned"], -c["size_bytes"], c["last_used"]))
    return victim["key"]

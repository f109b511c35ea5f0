"""Driving a decoding strategy with a HF model, and HF's own beam search to compare with.

The driver runs no KV cache: every step is one full forward over each running beam's
whole sequence (float32), batched W wide like HF's, so both see the same logits.
"""

from __future__ import annotations

import torch

from loragate.plugins.builtin.beam_search import BeamSearch


@torch.no_grad()
def drive_beam_search(model, prompt: list[int], params: dict, eos: set[int], max_tokens: int):
    strategy = BeamSearch()
    state = strategy.start(params, eos, max_tokens)
    width = params["best_of"]
    running: list[list[int]] = [[]]
    steps = 0
    while True:
        batch = [prompt + tokens for tokens in running]
        if len(batch) < width:  # HF's first forward runs W copies of the prompt
            batch = batch * width
        ids = torch.tensor(batch)
        logits = model(ids, attention_mask=torch.ones_like(ids), logits_to_keep=1).logits
        logprobs = torch.log_softmax(logits[:, -1, :].float(), dim=-1)[: state.num_running]
        decision = strategy.step(state, logprobs)
        steps += 1
        if decision.done:
            break
        assert len(decision.parents) == len(decision.tokens) == width
        running = [running[p] + [t] for p, t in zip(decision.parents, decision.tokens, strict=True)]
        assert running == state.running_tokens
    assert steps <= max_tokens
    return [(list(h.token_ids), h.score) for h in strategy.finish(state)]


@torch.no_grad()
def hf_beam_search(
    model,
    prompt: list[int],
    params: dict,
    eos: list[int],
    max_tokens: int,
    use_cache: bool = False,
):
    """HF's returned sequences (generated part, up to each one's own length) and scores."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        num_beams=params["best_of"],
        num_return_sequences=params["n"],
        do_sample=False,
        max_new_tokens=max_tokens,
        min_new_tokens=params.get("min_tokens") or None,
        length_penalty=params["length_penalty"],
        early_stopping=params["early_stopping"],
        eos_token_id=eos,
        pad_token_id=eos[0],
        use_cache=use_cache,
        return_dict_in_generate=True,
        output_scores=True,
    )
    results = []
    for row in range(params["n"]):
        length = int((out.beam_indices[row] != -1).sum())
        tokens = out.sequences[row, len(prompt) : len(prompt) + length].tolist()
        results.append((tokens, float(out.sequences_scores[row])))
    return results

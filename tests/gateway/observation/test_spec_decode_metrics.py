"""Speculative decoding over HTTP (issue 61): `speculative_config` from the server's
settings, the request's `"speculative": false` opt-out, and vLLM's spec-decode counters in
/metrics per adapter and method. The proposer is a test plugin that proposes the tiny
model's own greedy continuation (HF's), so every proposal is accepted."""

from __future__ import annotations

import httpx
import torch
from gateway_testlib import metrics
from servers_testlib import start_tiny_server

from loragate.plugins import hookimpl

PROMPT = [1, 300, 301, 302, 303]


class SameModelProposer:
    def __init__(self, hf):
        self.hf = hf

    def propose(self, rows, options):
        proposals = []
        for row in rows:
            ids = torch.tensor([row["token_ids"]])
            with torch.inference_mode():
                out = self.hf.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=row["max_tokens"],
                    min_new_tokens=row["max_tokens"],
                    do_sample=False,
                    pad_token_id=2,
                )
            proposals.append(out[0, ids.shape[1] :].tolist())
        return proposals

    @hookimpl
    def loragate_speculative_proposers(self):
        return {"same-model": self.propose}


def counts(url: str) -> dict[str, float]:
    return {k: v for k, v in metrics(url).items() if k.startswith("vllm:spec_decode")}


def test_speculation_opt_out_and_metrics_over_http(tiny_dir, tiny_hf):
    engine = {
        "speculative_config": {"method": "same-model", "num_speculative_tokens": 3},
        "plugins": (SameModelProposer(tiny_hf),),
        "served_model_name": "tiny",
    }
    server = start_tiny_server(tiny_dir, engine)
    try:
        body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
        body["ignore_eos"] = True
        url = f"{server.url}/v1/completions"
        opted_out = httpx.post(url, json={**body, "speculative": False}, timeout=60)
        assert opted_out.status_code == 200, opted_out.text
        opted_out = opted_out.json()
        before = counts(server.url)
        default = httpx.post(url, json=body, timeout=60).json()
        after = counts(server.url)
        bad = httpx.post(url, json={**body, "speculative": "no"}, timeout=60)
    finally:
        server.stop()
    assert opted_out["choices"][0]["text"] == default["choices"][0]["text"]
    assert not any(before.values()), before
    labels = '{lora_name="__base__",method="same-model",model_name="tiny"}'
    drafts = after[f"vllm:spec_decode_num_drafts_total{labels}"]
    proposed = after[f"vllm:spec_decode_num_draft_tokens_total{labels}"]
    accepted = after[f"vllm:spec_decode_num_accepted_tokens_total{labels}"]
    assert drafts >= 2 and proposed >= drafts and accepted == proposed
    first = '{lora_name="__base__",method="same-model",model_name="tiny",position="0"}'
    assert after[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{first}"] == drafts
    assert bad.status_code == 400 and "speculative" in bad.text

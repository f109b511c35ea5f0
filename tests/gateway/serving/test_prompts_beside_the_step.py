"""A request's prompt is tokenized beside the engine's step, never behind it.

Its length is what a tokens-per-minute quota charges, so a request to be refused with 429
is tokenized first; done on the engine thread, that refusal (and every /tokenize) waited
for the step in progress, seconds long in a big model's prefill. Here the engine thread is
held inside a step (a sampler that waits for the test's permit), and the gateway answers
anyway: the 429, a text and a chat /tokenize, all while no step can end."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from gateway_test_plugin import GatedPlugin
from tenancy_testlib import ADMIN_KEY, Api
from transformers import AutoTokenizer


def test_refusals_and_tokenizing_do_not_wait_for_a_held_step(replicas, tiny_dir):
    saved_tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    gate = GatedPlugin()
    (server,) = replicas(1, engine={"plugins": (gate,)})
    admin = Api(server.url, ADMIN_KEY)
    thrifty = admin.as_key(admin.create_tenant("thrifty", tokens_per_minute=60))
    base = admin.base_model()
    needs = 40  # the stream's worst case (its prompt and 40 tokens) is held from the quota
    body = {
        "model": base,
        "prompt": "Go",
        "max_tokens": needs,
        "ignore_eos": True,
        "stream": True,
        "sampler": "gated_greedy",
    }
    chat = [{"role": "user", "content": "Say hello"}]
    text = "Hello world, how are you?"
    gate.allow(1)  # the response starts with the first token
    url = f"{server.url}/v1/completions"
    with (
        httpx.stream("POST", url, json=body, headers=thrifty.headers, timeout=120) as r,
        ThreadPoolExecutor(3) as pool,
    ):
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        gate.wait_for_a_held_step()
        passed = gate.passed
        probes = [
            pool.submit(thrifty.complete, base, "Tell me a story", max_tokens=30),
            pool.submit(admin.post, "/tokenize", {"model": base, "prompt": text}),
            pool.submit(admin.post, "/tokenize", {"model": base, "messages": chat}),
        ]
        refused, tokenized, templated = (p.result() for p in probes)
        # Nothing above could have waited for a step: none could end.
        assert gate.passed == passed and gate.waiting == 1
        gate.allow(needs)
        rest = list(lines)
    assert refused.status_code == 429, refused.text
    assert "tokens_per_minute" in refused.text
    assert tokenized.status_code == 200, tokenized.text
    assert tokenized.json()["tokens"] == saved_tokenizer.encode(text)
    assert templated.status_code == 200, templated.text
    expected = saved_tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    assert templated.json()["tokens"] == list(expected)
    assert "data: [DONE]" in rest
    assert not any('"error"' in line for line in rest), "the held stream failed"

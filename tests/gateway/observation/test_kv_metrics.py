"""GET /metrics over real HTTP reports the KV cache's memory: blocks named in the prefix cache
and its hit rate, internal fragmentation while a request runs, and blocks swapped to CPU."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_test_plugin import GatedPlugin
from gateway_testlib import ENGINE, kv_idle, metrics, wait_until

GATE = GatedPlugin()  # kv_url's: a request's steps are the test's to give, a permit each
BLOCK = ENGINE["block_size"]
KV_SERIES = (
    "loragate_kv_cache_cached_blocks",
    "loragate_kv_cache_swapped_blocks",
    "loragate_kv_cache_internal_fragmentation",
    "loragate_prefix_cache_hit_rate",
)


@pytest.fixture(scope="module")
def kv_url(start_server):
    """A server of its own (its counters start at zero), with GATE's gated_greedy sampler."""
    return start_server(plugins=(GATE,)).url


def complete(url: str, prompt: list[int], max_tokens: int, **extra) -> httpx.Response:
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


def test_a_fresh_server_reports_every_kv_series_at_zero(kv_url):
    m = metrics(kv_url)
    for name in KV_SERIES:
        assert m[name] == 0, name


def test_a_repeated_long_prompt_fills_the_prefix_cache_and_hits_it(kv_url):
    prompt = [1] + list(range(5000, 5199))  # 200 tokens: 12 full blocks and 8 tokens
    full_blocks = len(prompt) // BLOCK
    before = metrics(kv_url)
    assert complete(kv_url, prompt, 2).status_code == 200
    wait_until(lambda: kv_idle(kv_url), "idle")
    first = metrics(kv_url)
    assert first["loragate_kv_cache_allocated_blocks"] == 0
    assert (
        first["loragate_kv_cache_cached_blocks"]
        >= before["loragate_kv_cache_cached_blocks"] + full_blocks
    )
    assert (
        first["loragate_prefix_cache_hit_tokens_total"]
        == before["loragate_prefix_cache_hit_tokens_total"]
    )

    assert complete(kv_url, prompt, 2).status_code == 200
    wait_until(lambda: kv_idle(kv_url), "idle")
    second = metrics(kv_url)
    hits = second["loragate_prefix_cache_hit_tokens_total"]
    assert hits - first["loragate_prefix_cache_hit_tokens_total"] == full_blocks * BLOCK
    assert second["loragate_kv_cache_cached_blocks"] >= full_blocks
    queried = second["loragate_prefix_cache_queried_tokens_total"]
    assert 0 < second["loragate_prefix_cache_hit_rate"] <= 1
    assert second["loragate_prefix_cache_hit_rate"] == pytest.approx(hits / queried)


def test_internal_fragmentation_is_the_unused_tail_of_the_last_block(kv_url):
    """One running sequence wastes 0..BLOCK-1 slots of its last block: the gauge times the
    allocated slots is such a whole number, some of the time above zero. The request's steps
    are the test's to give (a permit each) and it never gets its last: it takes a step, then
    /metrics is read while it runs (a scrape is answered between two steps, so it is given
    one step at a time until the scrape is answered), 20 times, and then the test hangs up."""
    wait_until(lambda: kv_idle(kv_url), "idle")
    prompt = [1] + list(range(7000, 7039))  # 40 tokens
    model = httpx.get(f"{kv_url}/v1/models").json()["data"][0]["id"]
    needs = ENGINE["max_model_len"] - 40
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": needs,
        "temperature": 0,
        "ignore_eos": True,
        "sampler": "gated_greedy",
        "stream": True,
    }
    wasted_slots = []
    GATE.allow(1)  # the response starts with the first token
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{kv_url}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # kept: a dropped iterator closes the stream (an abort)
        next(line for line in lines if line.startswith("data:"))
        for _ in range(20):
            GATE.allow(1)  # a step between two samples: the sequence grows
            m = GATE.answer(lambda: metrics(kv_url), short_of=needs)
            allocated = m["loragate_kv_cache_allocated_blocks"]
            assert m["loragate_num_requests_running"] == 1 and allocated > 0
            fragmentation = m["loragate_kv_cache_internal_fragmentation"]
            assert 0 <= fragmentation < 1
            slots = fragmentation * allocated * BLOCK
            assert slots == pytest.approx(round(slots), abs=1e-6)
            wasted_slots.append(round(slots))
    GATE.open()  # the stream was left mid-way (an abort): its next step ends it
    assert len(wasted_slots) == 20
    assert all(0 <= w < BLOCK for w in wasted_slots)
    assert max(wasted_slots) > 0
    wait_until(lambda: kv_idle(kv_url), "idle")
    assert metrics(kv_url)["loragate_kv_cache_internal_fragmentation"] == 0


def test_swapped_blocks_are_reported_while_a_preempted_request_waits(start_server):
    """Few KV blocks and preemption by swap: a victim's blocks show up as swapped, then all
    requests finish in full and nothing stays swapped. The requests' steps are the test's to
    give (a permit each): /metrics is read after each step until it shows a swapped block,
    so the swap is seen at the first step's end at which a victim waits, however fast the
    steps or slow the scrapes (a scrape is answered between two steps: while it is out the
    requests are given one step at a time)."""
    gate = GatedPlugin()
    url = start_server(
        plugins=(gate,),
        max_model_len=128,
        num_kv_blocks=20,
        max_num_seqs=8,
        preemption_mode="swap",
        swap_space=0.01,
    ).url
    prompts = [[1] + list(range(200 + 7 * i, 200 + 7 * i + 20 + 9 * i)) for i in range(8)]
    steps = len(prompts) * 40  # more than all of them need, finishing one after another

    def swapped_after_a_step() -> float:
        gate.allow(1)
        return gate.answer(lambda: metrics(url)["loragate_kv_cache_swapped_blocks"], steps)

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(complete, url, p, 40, sampler="gated_greedy") for p in prompts]
        swapped = wait_until(swapped_after_a_step, "a swapped block")
        gate.open()
        answers = [f.result() for f in futures]
    assert swapped > 0
    assert [a.status_code for a in answers] == [200] * len(prompts)
    assert all(a.json()["usage"]["completion_tokens"] == 40 for a in answers)
    wait_until(lambda: kv_idle(url), "idle")
    m = metrics(url)
    assert m["loragate_kv_cache_swapped_blocks"] == 0
    assert m["loragate_num_preemptions_total"] > 0

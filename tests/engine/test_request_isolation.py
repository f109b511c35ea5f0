"""Whatever raises while the engine serves one request fails that request alone (issue 20,
item 1): beam search, the built-in sampler, detokenizing, an adapter that cannot take a
slot. The other requests of the batch finish normally and every KV block is freed (the
autouse leak check)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from loragate.adapters import AdapterError, AdapterLoadTimeoutError, LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.tools import make_random_adapter

PROMPT = {"prompt_token_ids": [1, 20, 30, 40]}
GREEDY = dict(temperature=0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def _run(engine, requests: dict) -> dict:
    """Step until every request ended; the last output of each."""
    last = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            last[out.request_id] = out
    assert set(last) == set(requests)
    return last


@pytest.mark.parametrize(
    "field, value",
    [
        ("length_penalty", 1e308),
        ("length_penalty", -11.0),
        ("temperature", 1e308),
        ("repetition_penalty", 1e308),
        ("repetition_penalty", 1e-308),
    ],
)
def test_values_that_could_overflow_are_refused_naming_the_field(field, value):
    beam = {"use_beam_search": True, "best_of": 2, "temperature": 0}
    extra = beam if field == "length_penalty" else {}
    with pytest.raises(ValueError, match=f"^{field} must be in"):
        SamplingParams(**{**extra, field: value})


def test_beam_search_raising_on_the_engine_thread_fails_only_its_request(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=64)
    engine = llm.engine
    doomed = SamplingParams(use_beam_search=True, best_of=2, temperature=0, max_tokens=6)
    doomed.length_penalty = 1e308  # past validation, as the gateway once let it through
    beam = SamplingParams(use_beam_search=True, best_of=2, n=2, temperature=0, max_tokens=6)
    engine.add_request("doomed", PROMPT, doomed)
    engine.add_request("beam", PROMPT, beam)
    engine.add_request("plain", PROMPT, SamplingParams(**GREEDY))
    outs = _run(engine, {"doomed", "beam", "plain"})
    assert outs["doomed"].finished and outs["doomed"].error_type == "plugin_error"
    assert "OverflowError" in outs["doomed"].error
    assert [o.finish_reason for o in outs["doomed"].outputs] == ["error"]
    assert outs["beam"].error is None and len(outs["beam"].outputs) == 2
    assert outs["plain"].error is None and len(outs["plain"].outputs[0].token_ids) == 6
    # the engine goes on serving
    again = llm.generate(PROMPT, SamplingParams(**GREEDY), use_tqdm=False)[0]
    assert again.outputs[0].token_ids == outs["plain"].outputs[0].token_ids


def test_the_built_in_sampler_failing_on_one_row_fails_only_that_request(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=64)
    engine = llm.engine
    sampler = engine.dispatcher.sampler

    def fragile(logits, rows):
        if any(row.params.seed == 13 for row in rows):
            raise RuntimeError("probability tensor contains nan")
        return sampler(logits, rows)

    engine.dispatcher.sampler = fragile
    try:
        engine.add_request("doomed", PROMPT, SamplingParams(seed=13, max_tokens=6))
        engine.add_request("a", PROMPT, SamplingParams(**GREEDY))
        engine.add_request("b", PROMPT, SamplingParams(seed=1, max_tokens=6, ignore_eos=True))
        outs = _run(engine, {"doomed", "a", "b"})
    finally:
        engine.dispatcher.sampler = sampler
    assert outs["doomed"].error_type == "request_failed"
    assert "RuntimeError" in outs["doomed"].error and "nan" not in outs["doomed"].error
    assert outs["a"].error is None and len(outs["a"].outputs[0].token_ids) == 6
    assert outs["b"].error is None and len(outs["b"].outputs[0].token_ids) == 6


def test_detokenizing_failing_for_one_request_fails_only_it(tiny_dir, make_llm):
    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=64)
    engine = llm.engine
    processor = engine.output_processor
    make = processor.new_detokenizer

    def broken(token_ids):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    def fragile(request):
        detokenizer = make(request)
        if request.request_id == "doomed":
            detokenizer.step = broken
        return detokenizer

    processor.new_detokenizer = fragile
    engine.add_request("doomed", PROMPT, SamplingParams(n=2, **GREEDY))
    engine.add_request("fine", PROMPT, SamplingParams(**GREEDY))
    outs = _run(engine, {"doomed", "fine"})
    assert outs["doomed"].error_type == "request_failed"
    assert all(o.finish_reason == "error" for o in outs["doomed"].outputs)
    assert outs["fine"].error is None and len(outs["fine"].outputs[0].token_ids) == 6


def test_an_adapter_that_cannot_take_a_slot_fails_only_its_request(
    tiny_dir, tiny_model_dir, tmp_path, make_llm
):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir)
    make_random_adapter(hf, tmp_path / "a", rank=4, targets=["q_proj"], seed=1)
    make_random_adapter(hf, tmp_path / "b", rank=4, targets=["q_proj"], seed=2)
    llm = make_llm(
        model=tiny_dir, max_model_len=64, num_kv_blocks=64, enable_lora=True, max_lora_rank=8
    )
    engine = llm.engine
    good, bad = LoRARequest("a", 1, str(tmp_path / "a")), LoRARequest("b", 2, str(tmp_path / "b"))
    acquire = engine.residency.acquire_slot

    def failing(request, busy_slots=frozenset(), identity=None, **kwargs):
        if request == bad:
            raise AdapterError("adapter_model.safetensors changed on disk")
        return acquire(request, busy_slots, identity, **kwargs)

    engine.residency.acquire_slot = failing
    try:
        engine.add_request("doomed", PROMPT, SamplingParams(**GREEDY), lora_request=bad)
        engine.add_request("fine", PROMPT, SamplingParams(**GREEDY), lora_request=good)
        engine.add_request("base", PROMPT, SamplingParams(**GREEDY))
        outs = _run(engine, {"doomed", "fine", "base"})
    finally:
        engine.residency.acquire_slot = acquire
    assert outs["doomed"].error_type == "request_failed"
    assert outs["fine"].error is None and len(outs["fine"].outputs[0].token_ids) == 6
    assert outs["base"].error is None


async def test_an_adapter_load_past_its_time_limit_is_refused_and_serving_goes_on(
    tiny_dir, tmp_path, make_llm
):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dir)
    make_random_adapter(hf, tmp_path / "slow", rank=4, targets=["q_proj"], seed=1)
    llm = make_llm(
        model=tiny_dir, max_model_len=64, num_kv_blocks=64, enable_lora=True, max_lora_rank=8
    )
    residency = llm.engine.residency
    preload = residency.preload
    release, ended = threading.Event(), threading.Event()

    def slow_preload(request):
        try:  # held as a huge or hostile file would hold it, until the test lets it go
            assert release.wait(120), "the test never released the held load"
            return preload(request)
        finally:
            ended.set()

    residency.preload = slow_preload
    engine = AsyncLLMEngine(llm.engine, adapter_load_timeout=0.3)
    try:
        with pytest.raises(AdapterLoadTimeoutError, match="longer than 0.3 s"):
            lora = LoRARequest("slow", 1, str(tmp_path / "slow"))
            stream = engine.generate(PROMPT, SamplingParams(**GREEDY), "slow", lora)
            await anext(stream)
        assert not ended.is_set(), "the refusal came from the time limit, not the load's end"
        outs = [o async for o in engine.generate(PROMPT, SamplingParams(**GREEDY), "base")]
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 6
    finally:
        release.set()
        # the abandoned load ends before the leak check (bounded: the load is tiny)
        assert await asyncio.to_thread(ended.wait, 120), "the abandoned load never ended"
        residency.preload = preload
        engine.shutdown()


def test_building_one_answer_failing_fails_only_that_request(tiny_dir, make_llm, monkeypatch):
    from loragate.engine.outputs import output_processor

    llm = make_llm(model=tiny_dir, max_model_len=64, num_kv_blocks=64)
    engine = llm.engine
    build = output_processor.request_output

    def fragile(state, tokenizer, eos_token_ids, finished):
        if state.request.request_id == "doomed" and finished and state.error is None:
            raise KeyError("a tokenizer without that token")
        return build(state, tokenizer, eos_token_ids, finished)

    monkeypatch.setattr(output_processor, "request_output", fragile)
    engine.add_request("doomed", PROMPT, SamplingParams(n=2, **GREEDY))
    engine.add_request("fine", PROMPT, SamplingParams(**GREEDY))
    outs = _run(engine, {"doomed", "fine"})
    assert outs["doomed"].finished and outs["doomed"].error_type == "request_failed"
    assert [o.finish_reason for o in outs["doomed"].outputs] == ["error", "error"]
    assert outs["fine"].error is None and len(outs["fine"].outputs[0].token_ids) == 6
    assert not engine.has_unfinished_requests()

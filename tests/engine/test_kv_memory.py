"""Prefix caching per adapter and tenant, swap preemption, chunked prefill, memory stats."""

from __future__ import annotations

import pytest
from tiny_llama import hf_greedy
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.tools import make_random_adapter

GREEDY = SamplingParams(temperature=0, max_tokens=16, min_tokens=16)


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def two_adapters(tiny_model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir("llama"))
    root = tmp_path_factory.mktemp("kv-adapters")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return [
        LoRARequest(
            f"a{i}",
            i + 1,
            str(
                make_random_adapter(
                    base, root / f"a{i}", rank=8, targets=targets, seed=i, init_scale=0.3
                )
            ),
        )
        for i in range(2)
    ]


def run(engine, request_id, prompt, lora=None, salt=None, params=GREEDY):
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params, lora, cache_salt=salt)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id and out.finished:
                final = out
    return final.outputs[0].token_ids


def test_prefix_cache_same_outputs_and_shares_only_within_adapter_and_tenant(
    tiny_dir, two_adapters, make_llm
):
    common = dict(
        model=tiny_dir,
        max_model_len=256,
        num_kv_blocks=128,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=8,
    )
    cached = make_llm(enable_prefix_caching=True, **common).engine
    plain = make_llm(enable_prefix_caching=False, **common).engine
    system = [1] + list(range(1000, 1063))  # 64 tokens: 4 full blocks
    cases = [  # (suffix, adapter, tenant)
        ([5, 6, 7], None, "t1"),
        ([8, 9], None, "t1"),
        ([5, 6, 7], None, "t2"),
        ([5, 6, 7], two_adapters[0], "t1"),
        ([10, 11], two_adapters[0], "t1"),
        ([5, 6, 7], two_adapters[1], "t1"),
        ([5, 6, 7], two_adapters[0], "t2"),
    ]
    hits = []
    for i, (suffix, lora, tenant) in enumerate(cases):
        before = cached.block_manager.hit_tokens
        got = run(cached, f"c{i}", system + suffix, lora, tenant)
        hits.append(cached.block_manager.hit_tokens - before)
        assert got == run(plain, f"p{i}", system + suffix, lora, tenant)
        cached.check_integrity()
    # Only a repeat of the same (adapter, tenant) hits: cases 1 and 4, 64 tokens each.
    assert hits == [0, 64, 0, 0, 64, 0, 0]
    stats = cached.get_memory_stats()
    assert stats["cached_blocks"] > 0 and stats["allocated_blocks"] == 0
    assert stats["prefix_cache_hit_rate"] == pytest.approx(
        128 / sum(len(system) + len(s) for s, _, _ in cases)
    )


def test_cached_512_token_prefix_computes_less(tiny_dir, make_llm):
    engine = make_llm(model=tiny_dir, max_model_len=1024, num_kv_blocks=256).engine
    system = [1] + [2000 + i % 500 for i in range(511)]
    run(engine, "warm", system + [7, 7])
    before = engine.runner.num_computed_tokens_total
    run(engine, "hit", system + [8, 8], params=SamplingParams(temperature=0, max_tokens=1))
    assert engine.runner.num_computed_tokens_total - before == 2  # 512 + 2 - 512 cached
    cold = make_llm(
        model=tiny_dir, max_model_len=1024, num_kv_blocks=256, enable_prefix_caching=False
    ).engine
    run(cold, "miss", system + [8, 8], params=SamplingParams(temperature=0, max_tokens=1))
    assert cold.runner.num_computed_tokens_total == 514


def test_repeated_prompt_reuses_blocks_after_they_were_freed(tiny_dir, make_llm):
    engine = make_llm(model=tiny_dir, max_model_len=256, num_kv_blocks=64).engine
    prompt = [1] + list(range(300, 340))
    first = run(engine, "a", prompt)
    assert engine.get_memory_stats()["cached_blocks"] >= 2
    assert run(engine, "b", prompt) == first
    assert engine.block_manager.hit_tokens == 32


def test_cached_blocks_are_evicted_lru_when_memory_is_needed(tiny_dir, make_llm):
    engine = make_llm(model=tiny_dir, max_model_len=128, num_kv_blocks=12).engine
    for i in range(6):  # each prompt leaves 2 cached blocks; 12 blocks cannot keep them all
        run(engine, f"r{i}", [1] + list(range(100 * i, 100 * i + 40)))
        engine.check_integrity()
    assert engine.get_memory_stats()["cached_blocks"] <= 12
    before = engine.block_manager.hit_tokens
    run(engine, "old", [1] + list(range(0, 40)))  # the first prompt was evicted
    assert engine.block_manager.hit_tokens == before
    run(engine, "new", [1] + list(range(500, 540)))  # the last one is still cached
    assert engine.block_manager.hit_tokens == before + 32


PROMPTS = [[1] + list(range(200 + 7 * i, 200 + 7 * i + 20 + 9 * i)) for i in range(8)]
LONG = SamplingParams(temperature=0, max_tokens=40, min_tokens=40)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_swap_and_recompute_preemption_give_identical_outputs(tiny_dir, make_llm, mode):
    roomy = make_llm(model=tiny_dir, max_model_len=128, num_kv_blocks=256)
    expected = [
        o.outputs[0].token_ids
        for o in roomy.generate([{"prompt_token_ids": p} for p in PROMPTS], LONG, use_tqdm=False)
    ]
    tight = make_llm(
        model=tiny_dir,
        max_model_len=128,
        num_kv_blocks=20,
        max_num_seqs=8,
        preemption_mode=mode,
        swap_space=0.01,
        enable_prefix_caching=False,
    )
    outs = tight.generate([{"prompt_token_ids": p} for p in PROMPTS], LONG, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    engine = tight.engine
    assert engine.scheduler.num_preemptions > 0
    if mode == "swap":
        assert engine.swapper.num_swap_outs > 0 and engine.swapper.num_swap_ins > 0
        assert engine.swapper.num_swapped_blocks == 0
    else:
        assert engine.swapper is None
    assert engine.get_memory_stats()["allocated_blocks"] == 0


def test_chunked_prefill_keeps_decodes_flowing(tiny_dir, make_llm):
    engine = make_llm(
        model=tiny_dir,
        max_model_len=2200,
        num_kv_blocks=400,
        max_num_batched_tokens=256,
        max_num_seqs=32,
    ).engine
    decode_params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for i in range(16):
        engine.add_request(f"d{i}", {"prompt_token_ids": [1, 100 + i, 7]}, decode_params)
    for _ in range(3):
        engine.step()
    engine.add_request(
        "long",
        {"prompt_token_ids": [1] + [3000 + i % 700 for i in range(1999)]},
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    )
    steps_to_fill = 0
    while True:
        scheduled = engine.scheduler.schedule()
        decodes = {s.seq.request.request_id for s in scheduled.decodes}
        chunk = [s.num_new_tokens for s in scheduled.prefills if s.seq.request.request_id == "long"]
        # Every running decode advances in every step the long prompt fills.
        assert decodes == {f"d{i}" for i in range(16)}
        assert sum(chunk) + len(decodes) <= 256
        result = engine.runner.execute(scheduled)
        engine._records(engine.scheduler.update_from_output(scheduled, result))
        steps_to_fill += 1
        long_seq = engine.requests["long"].seqs[0]
        if long_seq.num_computed_tokens >= 2000:
            break
    assert steps_to_fill >= 2000 // 256
    # The tokens are right too: each decode's tokens so far, and the long prompt's first
    # token (sampled in the step that finished its last chunk), are HF's.
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    long_prompt = [1] + [3000 + i % 700 for i in range(1999)]
    assert long_seq.output_token_ids == hf_greedy(hf, long_prompt, 1)
    for i in range(16):
        so_far = engine.requests[f"d{i}"].seqs[0].output_token_ids
        assert len(so_far) >= steps_to_fill
        assert so_far == hf_greedy(hf, [1, 100 + i, 7], len(so_far)), f"d{i}"
    for request_id in list(engine.requests):
        engine.abort_request(request_id)


def test_memory_stats_report_fragmentation(tiny_dir, make_llm):
    engine = make_llm(model=tiny_dir, max_model_len=128, num_kv_blocks=64).engine
    engine.add_request("x", {"prompt_token_ids": list(range(1, 18))}, GREEDY)  # 17 tokens
    engine.step()
    stats = engine.get_memory_stats()
    assert stats["allocated_blocks"] == 2
    # 17 prompt tokens and the sampled 18th, whose slot is reserved: 14 of 32 slots unused.
    assert stats["internal_fragmentation"] == pytest.approx((32 - 18) / 32)
    assert {"swapped_blocks", "cached_blocks", "prefix_cache_hit_rate"} <= set(stats)
    engine.abort_request("x")


def test_fragmentation_counts_a_shared_last_block_once(tiny_dir, make_llm):
    engine = make_llm(model=tiny_dir, max_model_len=128, num_kv_blocks=64).engine
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=8)
    engine.add_request("x", {"prompt_token_ids": list(range(1, 18))}, params)
    engine.step()
    seqs = engine.requests["x"].seqs
    assert len({s.block_table[-1] for s in seqs}) == 1, "forks share the prompt's last block"
    stats = engine.get_memory_stats()
    assert stats["allocated_blocks"] == 2
    assert stats["internal_fragmentation"] == pytest.approx((32 - 18) / 32)
    engine.abort_request("x")

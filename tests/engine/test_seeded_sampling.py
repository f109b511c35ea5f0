"""Seeded sampling is reproducible and does not depend on what else is in the batch."""

from __future__ import annotations

from loragate.engine import SamplingParams


def test_same_seed_same_tokens_whatever_the_batch(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    target = {"prompt_token_ids": [1, 50, 60, 70]}
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24, ignore_eos=True)
    alone = llm.generate(target, seeded, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate(target, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": [1, 9, 8, 7, i]} for i in range(5)]
    unseeded = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    mixed = llm.generate(
        [others[0], target, *others[1:]],
        [unseeded, seeded] + [unseeded] * 4,
        use_tqdm=False,
    )
    assert alone == again
    assert mixed[1].outputs[0].token_ids == alone
    different = SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=24, ignore_eos=True)
    assert llm.generate(target, different, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_n_samples_differ_and_are_reproducible(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=16, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)[0]
    second = llm.generate({"prompt_token_ids": [1, 2, 3]}, params, use_tqdm=False)[0]
    tokens = [o.token_ids for o in first.outputs]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert tokens == [o.token_ids for o in second.outputs]
    assert len({tuple(t) for t in tokens}) == 3

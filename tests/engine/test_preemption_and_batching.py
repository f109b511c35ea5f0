"""Continuous batching under memory pressure: preemption by recompute keeps outputs exact."""

from __future__ import annotations

from tiny_llama import hf_greedy
from transformers import AutoModelForCausalLM

from loragate.engine import SamplingParams

PROMPTS = [
    {"prompt_token_ids": [1] + list(range(200 + 7 * i, 200 + 7 * i + 20 + 9 * i))} for i in range(8)
]
PARAMS = SamplingParams(temperature=0, max_tokens=40, min_tokens=40)


def test_preemption_keeps_every_output_identical(tiny_model_dir, make_llm):
    path = str(tiny_model_dir("llama"))
    roomy = make_llm(model=path, max_model_len=128, num_kv_blocks=256)
    expected = [o.outputs[0].token_ids for o in roomy.generate(PROMPTS, PARAMS, use_tqdm=False)]
    # 8 sequences of up to ~123 tokens need ~50 blocks of 16; give them 20.
    tight = make_llm(model=path, max_model_len=128, num_kv_blocks=20, max_num_seqs=8)
    outs = tight.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert tight.get_memory_stats()["allocated_blocks"] == 0


def test_default_model_preemption_matches_unconstrained(default_llm, make_llm):
    chats = ["Tell me about the moon.", "Name three colours.", "Why do cats purr?", "Hello!"]
    prompts = [
        {"prompt_token_ids": default_llm.apply_chat_template([{"role": "user", "content": c}])}
        for c in chats
    ]
    params = SamplingParams(temperature=0, max_tokens=48, min_tokens=48)
    expected = [
        o.outputs[0].token_ids for o in default_llm.generate(prompts, params, use_tqdm=False)
    ]
    tight = make_llm(max_model_len=128, num_kv_blocks=14, max_num_seqs=4)
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected


def test_new_requests_join_running_decodes(tiny_model_dir, make_llm):
    """A request added mid-flight is prefilled in the same step other sequences decode, and
    both give HF's greedy tokens."""
    model_dir = tiny_model_dir("llama")
    llm = make_llm(model=str(model_dir), max_model_len=128, num_kv_blocks=64)
    engine = llm.engine
    prompts = {"a": [1, 2, 3], "b": [4, 5, 6, 7]}
    engine.add_request("a", {"prompt_token_ids": prompts["a"]}, PARAMS)
    engine.step()
    engine.step()
    engine.add_request("b", {"prompt_token_ids": prompts["b"]}, PARAMS)
    scheduled = engine.scheduler.schedule()
    assert [s.seq.request.request_id for s in scheduled.decodes] == ["a"]
    assert [s.seq.request.request_id for s in scheduled.prefills] == ["b"]
    # Run the scheduled step through, then drain.
    result = engine.runner.execute(scheduled)
    records = engine._records(engine.scheduler.update_from_output(scheduled, result))
    outputs = engine.process_outputs(engine.step_output(records))
    while engine.has_unfinished_requests():
        outputs += engine.step()
    tokens = {o.request_id: o.outputs[0].token_ids for o in outputs if o.finished}
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    for request_id, prompt in prompts.items():
        assert tokens[request_id] == hf_greedy(hf, prompt, PARAMS.max_tokens), request_id


def test_finished_sequences_free_blocks_at_once(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    engine = llm.engine
    engine.add_request(
        "short",
        {"prompt_token_ids": [1, 2, 3]},
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
    )
    engine.add_request(
        "long",
        {"prompt_token_ids": [1, 2, 3]},
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
    )
    finished_short = False
    while not finished_short:
        finished_short = any(o.request_id == "short" and o.finished for o in engine.step())
    assert engine.get_memory_stats()["allocated_blocks"] == 1  # only "long" holds a block
    while engine.has_unfinished_requests():
        engine.step()


def test_abort_frees_blocks(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    engine = llm.engine
    engine.add_request("x", {"prompt_token_ids": list(range(1, 40))}, PARAMS)
    engine.step()
    assert engine.get_memory_stats()["allocated_blocks"] > 0
    assert engine.abort_request("x")
    assert not engine.abort_request("x")
    assert engine.get_memory_stats()["allocated_blocks"] == 0
    assert not engine.has_unfinished_requests()

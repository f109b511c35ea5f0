"""Qwen3, Gemma 3 (text), Phi-3 and Llama 3.x (llama3 rope) on tiny random models made from
each family's own config class: float32 greedy output token for token equal to HF
transformers, and with two PEFT adapters of different ranks (every projection the family's
adapters name, Phi-3's fused ones) beside base rows, equal to PEFT; all in one batch with
staggered arrivals, chunked prefill and preemption. bf16 stays top-5-close to HF float32.

Gemma's local layers have a window of 8 positions and every prompt is longer, so a local layer
that saw its whole context (or a global one that saw only a window) changes the output.
"""

from __future__ import annotations

import pytest
import torch
from family_models import (
    FAMILIES,
    GEMMA_WINDOW,
    LORA_TARGETS,
    PHI3_ORIGINAL_LEN,
    save_family_model,
)
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import hf_greedy, peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.tools import make_random_adapter

N = 12
ADAPTER_RANKS = {"low": (4, 8), "high": (16, 8)}  # name: (rank, alpha)


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory, tokenizer_dir):
    made = {}

    def make(family: str):
        if family not in made:
            out = tmp_path_factory.mktemp(f"family-{family}")
            made[family] = save_family_model(family, out, tokenizer_dir)
        return made[family]

    return make


@pytest.fixture(scope="module")
def family_adapters(family_dir, tmp_path_factory):
    made = {}

    def make(family: str):
        if family not in made:
            model_dir = family_dir(family)
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            root = tmp_path_factory.mktemp(f"family-adapters-{family}")
            paths = {
                name: make_random_adapter(
                    base,
                    root / name,
                    rank=rank,
                    alpha=alpha,
                    targets=LORA_TARGETS[family],
                    seed=20 + i,
                    init_scale=0.4,
                )
                for i, (name, (rank, alpha)) in enumerate(ADAPTER_RANKS.items())
            }
            made[family] = (paths, peft_model_with(model_dir, paths))
        return made[family]

    return make


def prompts(count: int) -> list[list[int]]:
    """Prompts of 13 to 13 + 7 * (count - 1) tokens: all longer than Gemma's window."""
    return [
        [1] + [(700 + 53 * i + 29 * j) % 40000 for j in range(12 + 7 * i)] for i in range(count)
    ]


def engine_for(make_llm, model_dir, **kwargs):
    """A small KV budget (preemption), a small token budget (chunked prefill)."""
    options = dict(
        model=str(model_dir),
        dtype="float32",
        max_model_len=PHI3_ORIGINAL_LEN,
        block_size=8,
        num_kv_blocks=16,
        max_num_batched_tokens=24,
        max_num_seqs=8,
    )
    return make_llm(**{**options, **kwargs}).engine


def assert_hard_paths_ran(engine, log) -> None:
    assert log.partial_chunks >= 1, "no prefill was chunked"
    assert log.mixed_steps >= 2, "no step mixed prefill and decode"
    assert engine.scheduler.num_preemptions >= 1, "nothing was preempted"


@pytest.mark.parametrize("family", FAMILIES)
def test_family_greedy_matches_hf_under_staggering_chunking_and_preemption(
    family, family_dir, make_llm
):
    model_dir = family_dir(family)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    items = [(i, f"r{i}", ids) for i, ids in enumerate(prompts(6))]
    engine = engine_for(make_llm, model_dir)
    log = record_steps(engine)
    outputs = drive(engine, [(s, rid, ids, None) for s, rid, ids in items], greedy(N))
    assert_hard_paths_ran(engine, log)
    expected = {rid: hf_greedy(hf, ids, N) for _, rid, ids in items}
    assert len({tuple(v) for v in expected.values()}) == len(items), "outputs must differ"
    for _, rid, _ in items:
        assert outputs[rid] == expected[rid], f"{family} {rid}"


@pytest.mark.parametrize("family", FAMILIES)
def test_family_adapters_and_base_rows_match_peft(family, family_dir, family_adapters, make_llm):
    model_dir = family_dir(family)
    paths, peft = family_adapters(family)
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = ["low", None, "high", "low", None, "high"]
    arrivals = [
        (i, f"a{i}", ids, loras.get(name))
        for i, (ids, name) in enumerate(zip(prompts(6), names, strict=True))
    ]
    engine = engine_for(make_llm, model_dir, enable_lora=True, max_loras=2, max_lora_rank=16)
    log = record_steps(engine)
    outputs = drive(engine, arrivals, greedy(N))
    assert_hard_paths_ran(engine, log)
    assert log.mixed_adapter_steps >= 2
    differs = False
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        expected = peft_greedy(peft, name, ids, N)
        assert outputs[rid] == expected, f"{family} {rid} ({name})"
        if name is not None:
            differs |= expected != peft_greedy(peft, None, ids, N)
    assert differs, "the adapters must change the output, or this test cannot fail"


def reference_logits(peft, name, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        if name is None:
            with peft.disable_adapter():
                return peft(input_ids=torch.tensor([ids])).logits[0].float()
        peft.set_adapter(name)
        return peft(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_bfloat16_is_top5_close_to_float32(family, family_dir, family_adapters, make_llm):
    """At every step the engine's token is in the float32 reference's top 5 and the
    reference's top token in the engine's (the reference teacher-forced on its tokens)."""
    model_dir = family_dir(family)
    paths, peft = family_adapters(family)
    loras = [None, *(LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items()))]
    llm = make_llm(
        model=str(model_dir),
        dtype="bfloat16",
        max_model_len=PHI3_ORIGINAL_LEN,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=16,
    )
    rows = prompts(3)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in rows],
        SamplingParams(temperature=0, max_tokens=N, min_tokens=N, logprobs=5),
        lora_request=loras,
        use_tqdm=False,
    )
    for prompt, lora, out in zip(rows, loras, outs, strict=True):
        name = lora.lora_name if lora else None
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        logits = reference_logits(peft, name, prompt + tokens)[len(prompt) - 1 : -1]
        top5 = logits.topk(5, dim=-1).indices.tolist()
        for step, (token, engine_top) in enumerate(zip(tokens, logprobs, strict=True)):
            assert token in top5[step], f"{family} {name} step {step}: not in the top 5"
            engine_top5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            assert top5[step][0] in engine_top5, f"{family} {name} step {step}: top not in 5"


def test_gemma_local_layers_see_only_their_window(family_dir, make_llm):
    """The window matters on this model: HF with the window widened to the whole context
    answers differently, and the engine answers as HF with the real window."""
    model_dir = family_dir("gemma3")
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = prompts(4)[3]
    assert len(ids) > 3 * GEMMA_WINDOW
    wide = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, sliding_window=4 * len(ids)
    ).eval()
    assert hf_greedy(wide, ids, N) != hf_greedy(hf, ids, N), "the window must change the output"
    llm = make_llm(model=str(model_dir), dtype="float32", max_model_len=PHI3_ORIGINAL_LEN)
    params = SamplingParams(temperature=0, max_tokens=N, min_tokens=N, logprobs=1)
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == hf_greedy(hf, ids, N)
    # The soft cap (final_logit_softcapping) keeps the argmax but not the logprobs.
    with torch.inference_mode():
        logits = hf(input_ids=torch.tensor([ids + out.token_ids])).logits[0, len(ids) - 1 : -1]
    expected = logits.float().log_softmax(-1)
    for step, (token, logprobs) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        assert logprobs[token] == pytest.approx(float(expected[step, token]), abs=1e-4), step

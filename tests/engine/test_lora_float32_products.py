"""float32 with the LoRA product path forced (kernels/lora_segment_gemm.py, on here with
LORAGATE_LORA_GEMM_ROWS=8 whatever the CPU): one adapter's long prompt joins while other
adapters' requests and a base one decode, so its prefill chunks run as products beside their
decoding rows on the native loop (the join step); every request's greedy tokens equal PEFT's
for its adapter at its own rank, token for token."""

from __future__ import annotations

import pytest
from staggered_testlib import drive, greedy, record_steps
from tiny_llama import peft_greedy, peft_model_with, ranked_adapters

from loragate.adapters import LoRARequest
from loragate.kernels import lora_cpu, lora_modules, lora_segment_gemm

N = 10
RANKS = {"r8": 8, "r16": 16, "r64": 64}
LONG_PROMPT = 150  # chunks of up to max_num_batched_tokens rows of one slot


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = ranked_adapters(model_dir, tmp_path_factory.mktemp("float32-products"), RANKS, seed=30)
    return str(model_dir), paths, peft_model_with(model_dir, paths)


def test_a_long_prompt_joins_on_products_beside_decoding_adapters(setup, make_llm, monkeypatch):
    assert lora_cpu.native_lora() is not None, lora_cpu.native_lora_error()
    monkeypatch.setenv(lora_segment_gemm.GEMM_ROWS_ENV, "8")
    joins = []  # (runs, rows left to the native loop) of each split with both
    real = lora_segment_gemm.long_segments

    def recorded(index, min_rows):
        found = real(index, min_rows)
        if found is not None and found.native_rows:
            joins.append((found.runs, found.native_rows))
        return found

    monkeypatch.setattr(lora_modules, "long_segments", recorded)
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    # Short prompts on r8, r16 and the base decode from step 2; r64's long prompt arrives at
    # step 4 and prefills in chunks beside them; r8's second long prompt joins later.
    arrivals = [
        (0, "short-r8", "r8", 7),
        (0, "short-r16", "r16", 9),
        (0, "short-base", None, 8),
        (4, "long-r64", "r64", LONG_PROMPT),
        (7, "long-r8", "r8", 90),
    ]
    prompts = {
        rid: [1] + [(900 + 53 * i + 7 * j) % 40000 for j in range(length - 1)]
        for i, (_, rid, _, length) in enumerate(arrivals)
    }
    engine = make_llm(
        model=model_dir,
        dtype="float32",
        max_model_len=256,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        enable_lora=True,
        max_loras=4,
        max_lora_rank=64,
    ).engine
    log = record_steps(engine)
    outputs = drive(
        engine,
        [(step, rid, prompts[rid], loras.get(name)) for step, rid, name, _ in arrivals],
        greedy(N),
    )
    assert log.mixed_steps >= 2, "no step mixed prefill and decode"
    assert log.partial_chunks >= 2, "the long prompts were not chunked"
    slots_on_products = {slot for runs, _ in joins for slot, _, _ in runs}
    assert len(slots_on_products) >= 2, f"no join step ran both long prompts: {joins}"
    assert any(end - first >= 32 for runs, _ in joins for _, first, end in runs), joins
    for _, rid, name, _ in arrivals:
        assert outputs[rid] == peft_greedy(peft, name, prompts[rid], N), f"{rid} ({name})"

"""Adapters of ranks 8, 16, 64 and 128 in one batch, each read at its own rank, with
staggered arrivals, chunked prefill and preemption: every row's float32 greedy tokens equal
PEFT's for its adapter, on each LoRA path this machine has (the native CPU loops, which read
each slot's rows at that slot's rank, and torch's grouped matmuls)."""

from __future__ import annotations

import pytest
import torch
from staggered_testlib import TIGHT_LORA_ENGINE, drive_under_pressure
from tiny_llama import peft_greedy, peft_model_with, ranked_adapters

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.kernels import lora_cpu

N = 12
RANKS = {"r8": 8, "r16": 16, "r64": 64, "r128": 128}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = ranked_adapters(model_dir, tmp_path_factory.mktemp("mixed-ranks"), RANKS, seed=80)
    return str(model_dir), paths, peft_model_with(model_dir, paths)


@pytest.mark.parametrize("path", ["native", "torch"])
def test_mixed_ranks_in_one_batch_match_peft(setup, make_llm, monkeypatch, path):
    if path == "torch":  # the native loops refuse every tensor: torch's path serves all
        monkeypatch.setattr(lora_cpu.NativeLoRA, "fits", staticmethod(lambda *t: False))
    else:
        assert lora_cpu.native_lora() is not None, lora_cpu.native_lora_error()
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = ["r128", "r8", None, "r64", "r16", "r8", "r128", None, "r64", "r16"]
    arrivals = [
        (i, f"m{i}", [1] + [(1200 + 41 * i + 9 * j) % 40000 for j in range(6 + 5 * i)], None)
        for i in range(len(names))
    ]
    arrivals = [
        (s, rid, ids, loras.get(n)) for (s, rid, ids, _), n in zip(arrivals, names, strict=True)
    ]
    options = {**TIGHT_LORA_ENGINE, "num_kv_blocks": 26, "max_num_seqs": 10}
    engine = make_llm(model=model_dir, **{**options, "max_lora_rank": 128}).engine
    outputs, log = drive_under_pressure(engine, arrivals, N)
    steps_with_all_ranks = sum(1 for s in log.steps if len(s["slots"] - {-1}) == 4)
    assert steps_with_all_ranks >= 1, "no step ran all four ranks together"
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        assert outputs[rid] == peft_greedy(peft, name, ids, N), f"{rid} ({name})"


@pytest.mark.parametrize("runs_on", ["products", "tiles"])
def test_mixed_ranks_in_bfloat16_through_the_run_paths(setup, make_llm, monkeypatch, runs_on):
    """bfloat16, each prompt's run of rows going through oneDNN's products
    (kernels/lora_segment_gemm.py, forced on here with LORAGATE_LORA_GEMM_ROWS) or through
    the native call's tiles (kernels/lora_tiles.h: AMX where the CPU has it, their emulation
    elsewhere; forced on with LORAGATE_LORA_TILE_ROWS) beside the other adapters' rows on the
    native loop: every row's greedy tokens stay top-5 close to PEFT float32 for its adapter at
    its own rank (the reference teacher-forced on them)."""
    from loragate.kernels import lora_modules, lora_segment_gemm

    runs, tiled = [], []
    if runs_on == "products":
        monkeypatch.setenv(lora_segment_gemm.GEMM_ROWS_ENV, "8")
        monkeypatch.setenv(lora_segment_gemm.TILE_ROWS_ENV, "0")
        real = lora_segment_gemm.apply_long_segments
        monkeypatch.setattr(
            lora_modules, "apply_long_segments", lambda *a: runs.append(a[1]) or real(*a)
        )
    else:
        monkeypatch.delenv(lora_segment_gemm.GEMM_ROWS_ENV, raising=False)
        monkeypatch.setenv(lora_segment_gemm.TILE_ROWS_ENV, "16")
        real_native = lora_modules._apply_native

        def recorded(native, x, modules, index, slot_ids, scales, out):
            taken = real_native(native, x, modules, index, slot_ids, scales, out)
            tiled.append((taken, slot_ids.tolist()))
            return taken

        monkeypatch.setattr(lora_modules, "_apply_native", recorded)
    model_dir, paths, peft = setup
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    names = ["r128", "r8", None, "r64", "r16", "r8"]
    rows = [[1] + [(1300 + 37 * i + 11 * j) % 40000 for j in range(20 + 3 * i)] for i in range(6)]
    llm = make_llm(
        model=model_dir, dtype="bfloat16", enable_lora=True, max_loras=4, max_lora_rank=128
    )
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in rows],
        SamplingParams(temperature=0, max_tokens=N, min_tokens=N, logprobs=5),
        lora_request=[loras.get(name) for name in names],
        use_tqdm=False,
    )
    if runs_on == "products":
        slots = {slot for call in runs for slot, _, _ in call}
        assert len(slots) >= 4, f"the prompts of every adapter ran as products, got {slots}"
    else:
        # A run of 32 rows of one slot leaves a whole tile of 16 to one thread however the
        # threads split the batch's rows, so a call holding one sent at least 16 to the tiles.
        assert sum(taken for taken, _ in tiled) > 0, "no rows went to the tiles"
        for taken, ids in tiled:
            if any(ids[i : i + 32] == [ids[i]] * 32 and ids[i] >= 0 for i in range(len(ids))):
                assert taken >= 16, f"a run of 32 rows missed the tiles: {ids}"
    for name, ids, out in zip(names, rows, outs, strict=True):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        if name is None:
            with peft.disable_adapter(), torch.inference_mode():
                logits = peft(input_ids=torch.tensor([ids + tokens])).logits[0]
        else:
            peft.set_adapter(name)
            with torch.inference_mode():
                logits = peft(input_ids=torch.tensor([ids + tokens])).logits[0]
        top5 = logits[len(ids) - 1 : -1].topk(5, dim=-1).indices.tolist()
        for step, (token, engine_top) in enumerate(zip(tokens, logprobs, strict=True)):
            assert token in top5[step], f"{name} step {step}: engine token not in top 5"
            engine_top5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            assert top5[step][0] in engine_top5, f"{name} step {step}: top not in engine's 5"

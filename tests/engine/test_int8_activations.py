"""The int8-activation mode (issue 59: the optional faster mode, never the default): a tiny
GGUF base in Q8_0, in Q4_1 and in a Q4_K_M-like mix (Q4_K, with Q6_K values, down
projections and output), base and adapter rows in one batch, greedy with top-5
logprobs, run once with float32 activations (the default) and once with
`activation_quantization="int8"`. Held to top-5-closeness: at every step up to and including
the first where the two choose differently, the int8 run's token is among the default run's
five most likely. The mode really ran: its logprobs differ from the default's."""

from __future__ import annotations

import pytest
from gguf_testlib import MIXED, write_quantized_gguf
from tiny_llama import ALL_MODULES

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, SamplingParams
from loragate.engine.loading.model_loader import resolve_model
from loragate.kernels.quant_int8 import takes_int8
from loragate.tools import make_random_adapter

PROMPTS = [[5, 70, 71, 72, 90, 33], list(range(40, 70)), [120] * 9 + [7, 8]]
NEW_TOKENS = 12


def run(make_llm, gguf, cache, lora, activation_quantization):
    llm = make_llm(
        model=str(gguf),
        weights_cache_dir=str(cache),
        max_model_len=128,
        kv_cache_memory_gb=0.02,
        enable_lora=True,
        max_lora_rank=8,
        max_loras=2,
        activation_quantization=activation_quantization,
    )
    rows = [(p, r) for p in PROMPTS for r in (None, lora)]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, logprobs=5)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p, _ in rows],
        params,
        lora_request=[r for _, r in rows],
        use_tqdm=False,
    )
    return [o.outputs[0] for o in outs], llm


@pytest.mark.parametrize("weight_type,types", [("Q8_0", None), ("Q4_1", None), ("Q4_K", MIXED)])
def test_int8_activations_stay_top5_close_to_float32(make_llm, tmp_path, weight_type, types):
    gguf = write_quantized_gguf(
        tmp_path / f"tiny.{weight_type}.gguf", weight_type, seed=7, types=types
    )
    cache = tmp_path / "cache"
    hf_dir = resolve_model(str(gguf), cache_dir=str(cache)).hf_dir
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    path = make_random_adapter(
        base, tmp_path / "a", rank=8, targets=list(ALL_MODULES), seed=1, init_scale=0.4
    )
    lora = LoRARequest("a", 1, str(path))
    exact, _ = run(make_llm, gguf, cache, lora, None)
    fast, llm = run(make_llm, gguf, cache, lora, "int8")
    down = llm.llm_engine.model.layers[0]["down"]
    assert down.activations == "int8" and takes_int8(down)
    assert down.format == (types or {}).get("ffn_down", weight_type)
    moved = 0
    for want, got in zip(exact, fast, strict=True):
        for step, (token, top) in enumerate(zip(got.token_ids, want.logprobs, strict=False)):
            assert token in top, (step, token, sorted(top))
            if token != want.token_ids[step]:
                break  # the contexts differ from here on
            moved += got.logprobs[step][token] != top[token]
    assert moved > 0  # the int8 products ran (the same tokens, other logprobs)


def test_a_bad_activation_quantization_is_refused_naming_it():
    with pytest.raises(ValueError, match="activation_quantization must be one of int8"):
        EngineConfig(activation_quantization="int4")


def test_the_cli_takes_it_into_the_engine_config(tmp_path, monkeypatch):
    """`serve DIR --activation-quantization int8` builds the settings (no server started);
    another value is refused naming the choice."""
    from click.testing import CliRunner

    from loragate.gateway.assembly import server
    from loragate.gateway.assembly.cli import main

    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, announce: seen.append(settings) or True)
    args = ["serve", str(tmp_path), "--activation-quantization", "int8"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert seen[-1].engine.activation_quantization == "int8"
    refused = CliRunner().invoke(main, ["serve", "--activation-quantization", "int4"])
    assert refused.exit_code != 0 and "'int4' is not 'int8'" in refused.output

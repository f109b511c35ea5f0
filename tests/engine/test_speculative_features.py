"""Speculative decoding beside the engine's other features (issue 61, must-shows 3 and 4).

- No leak: a run with rejected proposals, preemption (recompute and swap) and requests
  cancelled mid-run, with two adapters and base rows, leaves every KV block (device and
  swap) and every adapter slot free, and the requests that finished have the tokens of the
  same run without speculation.
- Structured output: with prompt lookup proposing from prompts that hold JSON (one of them
  with keys the schema forbids, so proposals copying it are refused by the grammar's mask),
  every output is valid against its schema, and equal to the output without speculation.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from structured_testlib import COLOR
from tiny_llama import build_tiny_model
from transformers import AutoTokenizer

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.sampling.structured_outputs import StructuredOutputsParams
from loragate.tools import make_random_adapter
from loragate.tools.base_model import TOKENIZER_FILES

VOCAB = 8
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory, tokenizer_dir):
    """An 8-token model (prompt lookup always proposes, often wrongly) and two adapters."""
    model = build_tiny_model(vocab_size=VOCAB, seed=5)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.3)
    out = tmp_path_factory.mktemp("vocab8-leaks")
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            (out / name).write_bytes((tokenizer_dir / name).read_bytes())
    adapters = {
        name: make_random_adapter(
            model, out / "adapters" / name, rank=4, targets=["q_proj", "v_proj"], seed=seed
        )
        for name, seed in (("a", 1), ("b", 2))
    }
    return out, adapters


def run(make_llm, model_dir, adapters, mode: str, speculative_config, cancel: set[str]):
    engine = make_llm(
        model=str(model_dir),
        dtype="float32",
        max_model_len=64,
        block_size=8,
        num_kv_blocks=14,
        max_num_seqs=6,
        max_num_batched_tokens=64,
        preemption_mode=mode,
        swap_space=0.01,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=4,
        speculative_config=speculative_config,
    ).engine
    loras = {n: LoRARequest(n, i + 1, str(p)) for i, (n, p) in enumerate(adapters.items())}
    names = ["a", None, "b", "a", "b", None, "a", "b"]
    for i, name in enumerate(names):
        prompt = [1, *[(3 * i + j) % VOCAB for j in range(6 + i)]]
        params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params, loras.get(name))
    done: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and out.request_id not in cancel:
                done[out.request_id] = out.outputs[0].token_ids
        steps += 1
        if steps == 6:
            for rid in cancel:
                assert engine.abort_request(rid)
    return engine, done


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_no_block_or_adapter_slot_leaks_after_rejections_preemptions_and_cancels(
    small_vocab, mode, make_llm
):
    model_dir, adapters = small_vocab
    cancel = {"r2", "r5"}
    _, without = run(make_llm, model_dir, adapters, mode, None, cancel)
    engine, with_spec = run(
        make_llm, model_dir, adapters, mode, {**NGRAM, "min_acceptance": 0}, cancel
    )
    assert with_spec == without and len(with_spec) == 6
    stats = {s["adapter"]: s for s in engine.scheduler.speculator.stats()}
    assert {"a", "b", None} <= set(stats), stats
    assert sum(s["accepted_tokens"] for s in stats.values()) > 0
    assert any(s["draft_tokens"] > s["accepted_tokens"] for s in stats.values()), "no rejection"
    assert engine.scheduler.num_preemptions >= 1, "nothing was preempted"
    if mode == "swap":
        assert engine.swapper.num_swap_outs >= 1 and engine.swapper.num_swapped_blocks == 0
    # Nothing left behind: KV blocks (device and swap), adapter slots and holds.
    engine.check_integrity()
    assert engine.get_memory_stats()["allocated_blocks"] == 0
    assert engine.scheduler.busy_adapter_slots() == set()
    assert not engine.scheduler.live_sequences()
    # Rows of the persistent batch are given back at the next step's sync: any still held
    # belongs to a sequence whose emptied table waits in that log.
    pending = engine.block_manager.changed_tables
    assert all(not pending[seq_id].block_table for seq_id in engine.runner.input_batch.row_of)
    assert engine.residency.counts()["held_weights"] == 0


# ---- structured output ------------------------------------------------------------------
TEXTS = [
    'Answer in JSON as in this example: {"color":"red","ok":true,"word":"apple"}. '
    'Now the same JSON again: {"color":"red","ok":true,"word":"apple"}. Once more:',
    'Example: {"colour":"blue","okay":false,"words":"sky"}. Your JSON for grass:',
    'Repeat this JSON: {"color":"green","ok":false,"word":"leaf"} and again:',
]


def test_structured_output_with_speculation_is_valid_and_unchanged(default_hf_dir, make_llm):
    tokenizer = AutoTokenizer.from_pretrained(default_hf_dir)
    prompts = [{"prompt_token_ids": tokenizer.encode(text)} for text in TEXTS]
    params = SamplingParams(
        temperature=0, max_tokens=40, structured_outputs=StructuredOutputsParams(json=COLOR)
    )
    outputs = {}
    for spec in (None, NGRAM):
        # A fixed budget: no step-time model, so every proposal that fits runs.
        llm = make_llm(
            dtype="float32",
            max_model_len=256,
            max_num_batched_tokens=256,
            speculative_config=spec,
        )
        outs = llm.generate(prompts, params, use_tqdm=False)
        outputs[spec is not None] = [o.outputs[0].token_ids for o in outs]
        for out in outs:
            jsonschema.validate(json.loads(out.outputs[0].text), COLOR)
    assert outputs[True] == outputs[False], [o.outputs[0].text for o in outs]
    stats = llm.engine.scheduler.speculator.stats()[0]
    assert stats["accepted_tokens"] > 0, stats
    assert stats["draft_tokens"] > stats["accepted_tokens"], stats

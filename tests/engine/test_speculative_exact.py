"""Speculative decoding is exact (issue 61, must-show 1). Four adapters of different kinds
in mixed batches with base rows, arriving at different steps under a small KV cache
(preemption) and a small token budget (chunked prefill), give float32 greedy tokens equal to
the same engine without speculation and to PEFT with each adapter:

- on the default model (real weights, which copy what a prompt repeats), plain LoRA, DoRA
  and LoRA on the embeddings and lm_head, with prompt lookup ("ngram") proposing from
  prompts that repeat themselves and prompts that do not;
- on a Qwen3 base, its own adapter beside base rows, where random weights copy nothing: a
  test proposer plugin proposes PEFT's own continuation with every third token wrong, so
  rows accept runs and reject tokens in every step.

Each test asserts that proposals were made, accepted and rejected, for adapter rows and base
rows, and that verified rows shared steps with other rows."""

from __future__ import annotations

import pytest
import torch
from adapter_kinds_testlib import make_kind
from family_models import LORA_TARGETS
from staggered_testlib import drive, greedy, record_steps
from test_model_families import engine_for, family_dir
from tiny_llama import peft_greedy, peft_model_with
from transformers import AutoModelForCausalLM, AutoTokenizer

from loragate.adapters import LoRARequest
from loragate.plugins import hookimpl

__all__ = ["family_dir"]  # the fixture, shared with the family tests

N = 24
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


def assert_speculated(engine, adapters: set) -> None:
    stats = {s["adapter"]: s for s in engine.scheduler.speculator.stats()}
    accepted = {name for name, s in stats.items() if s["accepted_tokens"] > 0}
    assert adapters <= accepted, f"no accepted proposals for {adapters - accepted}: {stats}"
    assert any(s["draft_tokens"] > s["accepted_tokens"] for s in stats.values()), "no rejection"
    beside_others = [
        r for r in engine.step_records if r.drafts and len(r.decode_seq_ids) > len(r.drafts)
    ]
    assert beside_others, "no step verified proposals beside other rows"
    assert engine.scheduler.num_preemptions >= 1, "nothing was preempted"


# ---- the default model, prompt lookup ---------------------------------------------------
TEXTS = [
    "Copy this list exactly: apples, pears, plums, figs, dates. Copy: apples, pears,",
    "What is the tallest mountain on Earth?",
    "Repeat after me: the quick brown fox jumps over the lazy dog. Again: the quick brown",
    "Name three colours.",
    "Say it twice: one two three four five six. Once more: one two three",
    "Edit the sentence 'the cat sat on the mat' to use a dog: the dog sat",
]
DEFAULT_KINDS = {
    "plain": dict(rank=8, alpha=16, targets=["q_proj", "v_proj", "down_proj"]),
    "dora": dict(rank=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"], use_dora=True),
    "vocab-lora": dict(rank=4, targets=["q_proj", "v_proj", "embed_tokens", "lm_head"]),
}


@pytest.fixture(scope="module")
def default_kinds(default_hf_dir, tmp_path_factory):
    base = AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32)
    root = tmp_path_factory.mktemp("spec-default-kinds")
    paths = {
        name: make_kind(base, root / name, spec, seed=70 + i, init_scale=0.1)
        for i, (name, spec) in enumerate(DEFAULT_KINDS.items())
    }
    return paths, peft_model_with(default_hf_dir, paths)


def default_run(make_llm, tokenizer, paths, names, **options):
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    arrivals = [
        (i // 2, f"d{i}", tokenizer.encode(text), loras.get(name))
        for i, (text, name) in enumerate(zip(TEXTS, names, strict=True))
    ]
    llm = make_llm(
        dtype="float32",
        max_model_len=128,
        block_size=8,
        num_kv_blocks=20,
        max_num_batched_tokens=40,
        max_num_seqs=6,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
        **options,
    )
    log = record_steps(llm.engine)
    return llm.engine, log, arrivals, drive(llm.engine, arrivals, greedy(N))


def test_prompt_lookup_on_the_default_model_gives_the_outputs_without_it_and_peft(
    default_kinds, default_hf_dir, make_llm
):
    paths, peft = default_kinds
    tokenizer = AutoTokenizer.from_pretrained(default_hf_dir)
    names = ["plain", None, "dora", "vocab-lora", None, "plain"]
    _, _, _, without = default_run(make_llm, tokenizer, paths, names)
    engine, log, arrivals, with_spec = default_run(
        make_llm, tokenizer, paths, names, speculative_config=NGRAM
    )
    assert with_spec == without
    for (_, rid, ids, _), name in zip(arrivals, names, strict=True):
        assert with_spec[rid] == peft_greedy(peft, name, ids, N), f"{rid} ({name})"
    assert_speculated(engine, {None, "plain", "dora"})
    assert log.mixed_adapter_steps >= 2


# ---- a Qwen3 base and its adapter, an oracle proposer ------------------------------------
def prompts(count: int) -> list[list[int]]:
    return [
        [1] + [(900 + 71 * i + 37 * j) % 40000 for j in range(10 + 5 * i)] for i in range(count)
    ]


class OracleProposer:
    """Proposes the reference continuation of each row's prompt, every third token wrong."""

    def __init__(self, expected: dict[tuple[int, ...], list[int]]):
        self.expected = expected

    def propose(self, rows: list[dict], options: dict) -> list[list[int]]:
        proposals = []
        for row in rows:
            prompt = tuple(row["token_ids"][: row["num_prompt_tokens"]])
            done = len(row["token_ids"]) - row["num_prompt_tokens"]
            ahead = self.expected[prompt][done : done + row["max_tokens"]]
            proposals.append(
                [t if (done + i) % 3 else (t + 1) % 40000 for i, t in enumerate(ahead)]
            )
        return proposals

    @hookimpl
    def loragate_speculative_proposers(self):
        return {"oracle": self.propose}


@pytest.fixture(scope="module")
def qwen3_adapter(family_dir, tmp_path_factory):
    model_dir = family_dir("qwen3")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    spec = dict(rank=8, alpha=16, targets=list(LORA_TARGETS["qwen3"]))
    path = make_kind(base, tmp_path_factory.mktemp("spec-qwen3") / "qwen3-lora", spec, seed=95)
    return model_dir, path, peft_model_with(model_dir, {"qwen3-lora": path})


def test_verification_on_a_qwen3_base_and_adapter_gives_the_outputs_without_it_and_peft(
    qwen3_adapter, make_llm
):
    model_dir, path, peft = qwen3_adapter
    names = ["qwen3-lora", None, "qwen3-lora", None, "qwen3-lora", None]
    rows = prompts(len(names))
    expected = {
        tuple(ids): peft_greedy(peft, name, ids, N) for ids, name in zip(rows, names, strict=True)
    }
    lora = LoRARequest("qwen3-lora", 1, str(path))
    arrivals = [
        (i // 2, f"q{i}", ids, lora if name else None)
        for i, (ids, name) in enumerate(zip(rows, names, strict=True))
    ]
    outputs = {}
    for options in ({}, {"speculative_config": {"method": "oracle", "num_speculative_tokens": 5}}):
        engine = engine_for(
            make_llm,
            model_dir,
            enable_lora=True,
            max_loras=1,
            max_lora_rank=8,
            num_kv_blocks=24,
            max_num_batched_tokens=40,
            plugins=[OracleProposer(expected)],
            **options,
        )
        outputs[bool(options)] = drive(engine, arrivals, greedy(N))
    assert outputs[True] == outputs[False]
    for _, rid, ids, _ in arrivals:
        assert outputs[True][rid] == expected[tuple(ids)], rid
    assert_speculated(engine, {None, "qwen3-lora"})

"""The draft-model proposer (issue 61): a smaller model with the target's vocabulary
proposes from its own paged KV. Float32 greedy outputs of a mixed batch (base rows and an
adapter's rows, staggered arrivals, chunked prefill, preemption) equal those without
speculation and HF/PEFT's, with the target itself as the draft (every base row's proposal
accepted, the adapter rows' partly rejected), with it and the adapter as the adapter's draft
adapter (every proposal accepted), and with a different one-layer draft; a draft with
another vocabulary is refused naming both sizes."""

from __future__ import annotations

import pytest
from staggered_testlib import drive, greedy
from tiny_llama import build_tiny_model, make_adapters, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest
from loragate.tools.base_model import TOKENIZER_FILES

N = 16
PROMPTS = [[1] + [(300 + 37 * i + 11 * j) % 40000 for j in range(9 + 4 * i)] for i in range(6)]
NAMES = [None, "tuned", None, "tuned", None, "tuned"]


def save_with_tokenizer(model, out, tokenizer_dir):
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            (out / name).write_bytes((tokenizer_dir / name).read_bytes())
    return out


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory, tokenizer_dir):
    target = tiny_model_dir("llama")
    specs = {"tuned": (8, ["q_proj", "v_proj", "down_proj"], False)}
    paths = make_adapters(target, tmp_path_factory.mktemp("draft-a"), specs)
    other = save_with_tokenizer(
        build_tiny_model(seed=9, num_hidden_layers=1),
        tmp_path_factory.mktemp("draft"),
        tokenizer_dir,
    )
    small_vocab = save_with_tokenizer(
        build_tiny_model(vocab_size=128), tmp_path_factory.mktemp("draft-v"), tokenizer_dir
    )
    return target, paths, other, small_vocab, peft_model_with(target, paths)


def run(make_llm, target, paths, speculative_config=None):
    lora = LoRARequest("tuned", 1, str(paths["tuned"]))
    arrivals = [
        (i // 2, f"r{i}", ids, lora if name else None)
        for i, (ids, name) in enumerate(zip(PROMPTS, NAMES, strict=True))
    ]
    llm = make_llm(
        model=str(target),
        dtype="float32",
        max_model_len=128,
        block_size=8,
        num_kv_blocks=20,
        max_num_batched_tokens=40,
        max_num_seqs=6,
        enable_lora=True,
        max_loras=1,
        max_lora_rank=8,
        speculative_config=speculative_config,
    )
    return llm.engine, drive(llm.engine, arrivals, greedy(N))


@pytest.mark.parametrize("draft", ["target", "target+adapter", "other"])
def test_draft_model_outputs_equal_those_without_it_and_peft(setup, make_llm, draft):
    target, paths, other, _, peft = setup
    model = str(other if draft == "other" else target)
    spec = {"method": "draft_model", "model": model, "num_speculative_tokens": 3}
    if draft == "target+adapter":
        spec["draft_adapters"] = {"tuned": str(paths["tuned"])}
    _, without = run(make_llm, target, paths)
    engine, with_spec = run(make_llm, target, paths, spec)
    assert with_spec == without
    for i, (ids, name) in enumerate(zip(PROMPTS, NAMES, strict=True)):
        assert with_spec[f"r{i}"] == peft_greedy(peft, name, ids, N), f"r{i} ({name})"
    stats = {s["adapter"]: s for s in engine.scheduler.speculator.stats()}
    assert stats[None]["drafts"] > 0 and stats["tuned"]["drafts"] > 0, stats
    if draft.startswith("target"):  # the draft is the base: it proposes the base rows' tokens
        assert stats[None]["accepted_tokens"] == stats[None]["draft_tokens"], stats
    if draft == "target":  # ... not the adapter's
        assert stats["tuned"]["accepted_tokens"] < stats["tuned"]["draft_tokens"], stats
    if draft == "target+adapter":  # its draft adapter is the adapter: it proposes its tokens
        assert stats["tuned"]["accepted_tokens"] == stats["tuned"]["draft_tokens"], stats
    assert engine.scheduler.num_preemptions >= 1, "nothing was preempted"


def test_a_draft_with_another_vocabulary_is_refused(setup, make_llm):
    target, _, _, small_vocab, _ = setup
    spec = {"method": "draft_model", "model": str(small_vocab)}
    with pytest.raises(ValueError, match="vocabulary of 128 tokens, the target's has 49152"):
        make_llm(model=str(target), dtype="float32", max_model_len=128, speculative_config=spec)

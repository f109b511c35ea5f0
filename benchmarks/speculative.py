"""Speculative decoding (prompt lookup) against the same engine without it, one run.

Three workloads on the default model, greedy, the same requests for both engines, rounds
alternating so load on the machine hits both alike:

- copy-1: one stream that copies (edit a given text, answer with quotes from the prompt);
- copy-8: eight concurrent copying streams, each under its own adapter (random, small);
- free-8 and free-1: streams with nothing to copy (open questions), where speculation
  should turn itself off.

Reported: output tokens per second of each engine, their ratio, and the acceptance rate per
adapter. Name the CPU and load with the figures (printed first).

    .venv/bin/python benchmarks/speculative.py --rounds 3

`--draft` measures the draft-model method instead of prompt lookup, with a draft made here
from the default model's family: `random:N` (N layers of random weights, HF's init: the
lower bound, whose proposals are all rejected, so speculation should turn itself off) or
`layers:N` (the default model's own first N layers and head: a smaller model of the same
family and tokenizer that agrees with it often).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from harness import machine_line
from transformers import AutoModelForCausalLM, AutoTokenizer

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.model_loader import resolve_model
from loragate.tools import make_random_adapter

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Every "
    "night its keeper climbed the narrow stairs, trimmed the wick and polished the great "
    "lens, so that ships passing in the dark would know where the rocks were. When the "
    "keeper grew old, his daughter took over the work, and she kept the light burning "
    "through the worst storms the coast had ever seen."
)
COPYING = [
    f"Rewrite this text exactly, changing only 'lighthouse' to 'tower':\n\n{PARAGRAPH}",
    f"Quote the sentence about the daughter from this text, word for word:\n\n{PARAGRAPH}",
    f"Repeat this text word for word:\n\n{PARAGRAPH}",
    f"Correct the spelling and copy the rest unchanged:\n\n{PARAGRAPH.replace('the', 'teh')}",
]
FREE = [
    "Write a short poem about autumn rain.",
    "Give three reasons to learn a second language.",
    "Describe your ideal weekend in a few sentences.",
    "What makes a good teacher? Answer briefly.",
]
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def adapters(count: int, root: Path) -> list[LoRARequest]:
    base = AutoModelForCausalLM.from_pretrained(resolve_model(None).hf_dir, dtype=torch.float32)
    made = []
    for i in range(count):
        path = make_random_adapter(
            base, root / f"a{i}", rank=8, targets=["q_proj", "v_proj"], seed=i, init_scale=0.05
        )
        made.append(LoRARequest(f"a{i}", i + 1, str(path)))
    return made


def make_draft(kind: str, root: Path) -> str:
    """A draft model's HF directory: `random:N` or `layers:N` (see the module's docs)."""
    how, _, layers = kind.partition(":")
    hf_dir = resolve_model(None).hf_dir
    target = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    config = target.config
    config.num_hidden_layers = int(layers)
    if how == "random":
        torch.manual_seed(0)
        draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    elif how == "layers":
        draft = target
        draft.model.layers = draft.model.layers[: int(layers)]
    else:
        raise SystemExit(f"--draft: expected random:N or layers:N, got {kind!r}")
    out = root / f"draft-{how}-{layers}"
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(hf_dir).save_pretrained(out)
    return str(out)


def run(llm: LLM, prompts, loras, max_tokens: int) -> tuple[float, int]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
    seconds = time.perf_counter() - start
    return seconds, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--workloads", default="copy-1,copy-8,free-8,free-1")
    ap.add_argument("--draft", help="random:N or layers:N: the draft-model method")
    args = ap.parse_args()
    print(machine_line() + f"; dtype {args.dtype}")
    options = dict(dtype=args.dtype, max_model_len=1024, enable_lora=True, max_loras=8)
    with tempfile.TemporaryDirectory() as tmp:
        spec_config = SPEC
        if args.draft:
            spec_config = {"method": "draft_model", "num_speculative_tokens": 4}
            spec_config["model"] = make_draft(args.draft, Path(tmp))
        print(f"# speculative_config {spec_config}")
        plain = LLM(**options)
        spec = LLM(**options, speculative_config=spec_config)
        chat = plain.apply_chat_template
        copying = [{"prompt_token_ids": chat([{"role": "user", "content": t}])} for t in COPYING]
        free = [{"prompt_token_ids": chat([{"role": "user", "content": t}])} for t in FREE]
        loras = adapters(8, Path(tmp))
        workloads = {
            "copy-1": ([copying[0]], [None]),
            "copy-8": ([copying[i % 4] for i in range(8)], loras),
            "free-8": ([free[i % 4] for i in range(8)], loras),
            "free-1": ([free[0]], [None]),
        }
        print("| workload | without (tok/s) | with (tok/s) | with / without | acceptance |")
        print("|---|---|---|---|---|")
        chosen = args.workloads.split(",")
        for name, (prompts, lora) in ((n, w) for n, w in workloads.items() if n in chosen):
            rates = {"without": [], "with": []}
            for llm in (plain, spec):  # warm: adapters loaded, step budget timed
                run(llm, prompts, lora, 8)
            spec.engine.scheduler.speculator.counts.clear()
            for _ in range(args.rounds):
                for key, llm in (("without", plain), ("with", spec)):
                    seconds, tokens = run(llm, prompts, lora, args.max_tokens)
                    rates[key].append(tokens / seconds)
            stats = spec.engine.scheduler.speculator.stats()
            proposed = sum(s["draft_tokens"] for s in stats)
            accepted = sum(s["accepted_tokens"] for s in stats)
            without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
            acceptance = f"{accepted}/{proposed}" if proposed else "no proposals"
            print(
                f"| {name} | {without:.1f} | {with_:.1f} | {with_ / without:.2f}x | {acceptance} |"
            )
            for s in stats:
                print(
                    f"#   {name} {s['adapter']}: {s['acceptance_rate']:.2f} of {s['draft_tokens']}"
                )
            fit = spec.engine.step_budget
            print(f"#   step-time model: {fit.fixed_ms:.1f} ms + {fit.ms_per_token:.2f} ms/token")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

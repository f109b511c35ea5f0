"""The int8-activation mode against the default float32 activations (issue 59), one run:
the default model from its Q4_1/Q8_0 file, greedy decode of the same requests at 1 and 8
streams, rounds alternating so load on the machine hits both alike. Reported: output tokens
per second of each and their ratio, and how many of the int8 run's tokens equal the
default's. Name the CPU and load with the figures (printed first).

    .venv/bin/python benchmarks/activation_quantization.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from loragate.engine import LLM, SamplingParams
from loragate.kernels.cpu_isa import this_cpu_flags

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "List some facts about the moon.",
    "Describe a walk in the forest.",
]


def run(llm: LLM, prompts, max_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    flags = sorted(f for f in this_cpu_flags() if f.startswith(("avx", "amx")))
    print(f"# flags {' '.join(flags)}; threads {torch.get_num_threads()}")
    print(f"# load average {os.getloadavg()[0]:.2f}; dtype {args.dtype}")
    options = dict(dtype=args.dtype, max_model_len=512)
    engines = {
        "float32 activations": LLM(**options),
        "int8 activations": LLM(**options, activation_quantization="int8"),
    }
    chat = engines["float32 activations"].apply_chat_template
    prompts = [{"prompt_token_ids": chat([{"role": "user", "content": p}])} for p in PROMPTS]
    print("| streams | float32 activations (tok/s) | int8 (tok/s) | int8 / float32 | same tokens |")
    print("|---|---|---|---|---|")
    for streams in (1, 8):
        batch = [prompts[i % len(prompts)] for i in range(streams)]
        rates = {name: [] for name in engines}
        for llm in engines.values():
            run(llm, batch, 8)  # warm
        outs = {}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                rate, outs[name] = run(llm, batch, args.max_tokens)
                rates[name].append(rate)
        a, b = (statistics.median(rates[n]) for n in engines)
        same = sum(
            x.outputs[0].token_ids[i] == y.outputs[0].token_ids[i]
            for x, y in zip(*outs.values(), strict=True)
            for i in range(len(x.outputs[0].token_ids))
        )
        total = sum(len(x.outputs[0].token_ids) for x in outs["float32 activations"])
        print(f"| {streams} | {a:.1f} | {b:.1f} | {b / a:.2f}x | {same}/{total} |")
    print(f"# load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

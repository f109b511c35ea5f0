"""A long prompt on one adapter against the same prompt on the base model: the prefill's cost
of LoRA (issue 47: "a long prompt on one adapter (2,048 tokens) at the base's speed").

One engine on the default model (SmolLM2-135M), one warm adapter of `--rank` on all seven
projections (in the CPU tier before the first round), prefix caching off so every round
computes the whole prompt; each round runs the prompt once on the base and once on the
adapter, one output token each, in turns so a load change hits both. Prints the medians
after the first round (warm-up) and their ratio. `LORAGATE_LORA_TILE_ROWS=0` turns the AMX
tiles off, for the path before them.

    .venv/bin/python benchmarks/long_prefill.py --dtype bfloat16 --rank 64
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import add_dtype, in_turns, machine_line, random_adapters

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=64)
    add_dtype(ap, "bfloat16")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        path = random_adapters(Path(root), 1, args.rank)[0]
        llm = LLM(
            dtype=args.dtype,
            max_model_len=args.tokens + 64,
            max_num_seqs=4,
            kv_cache_memory_gb=0.5,
            enable_lora=True,
            max_loras=2,
            max_cpu_loras=2,
            max_lora_rank=args.rank,
            enable_prefix_caching=False,
        )
        lora = LoRARequest("long", 1, str(path))
        llm.llm_engine.residency.preload(lora)
        prompt = [{"prompt_token_ids": [1 + (7 * j) % 40000 for j in range(args.tokens)]}]
        params = SamplingParams(temperature=0, max_tokens=1)

        def prefill(request):
            def one(_round: int) -> float:
                began = time.perf_counter()
                llm.generate(prompt, params, lora_request=request, use_tqdm=False)
                return time.perf_counter() - began

            return one

        times = in_turns(args.rounds, {"base": prefill(None), "adapter": prefill(lora)})
    base, adapter = (statistics.median(t[1:]) * 1e3 for t in times.values())
    print(machine_line() + f"; dtype {args.dtype}; rank {args.rank}")
    print(
        f"{args.tokens}-token prefill: base {base:.0f} ms, adapter {adapter:.0f} ms, "
        f"adapter / base {adapter / base:.2f}"
    )


if __name__ == "__main__":
    main()

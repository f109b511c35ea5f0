"""The engine with the native CPU kernels on and off, alternating in one process (A/B).

"off" runs the torch versions that the native kernels replaced (paged decode attention,
RMSNorm, RoPE, and LoRA where the native path serves the batch), which is what the engine ran
before them except that the norm and RoPE calls are the kernels' torch references. Reports
process CPU time per generated token (steadier than wall clock on a loaded machine) and wall
tok/s, median over the rounds. W1: base model only; W2: 16 rank-8 adapters on all seven
projections, power-law popularity (multi_lora.py's: benchmarks/offline_workloads.py).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/native_ab.py --dtype bfloat16 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from unittest import mock

from harness import kept_adapters
from offline_workloads import power_law_choice, word_workload

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.model_loader import resolve_model
from loragate.kernels import decode_attention, lora_torch, norm, rope


@contextlib.contextmanager
def natives_off():
    with (
        mock.patch.object(decode_attention, "native_attention", lambda: None),
        mock.patch.object(norm, "native_norm_rope", lambda: None),
        mock.patch.object(rope, "native_norm_rope", lambda: None),
        mock.patch.object(lora_torch, "native_lora", lambda: None),
    ):
        yield


def run(llm, prompts, lengths, loras) -> tuple[float, float]:
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    wall, cpu = time.perf_counter(), time.process_time()
    llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    tokens = sum(lengths)
    return (time.process_time() - cpu) / tokens * 1e3, tokens / (time.perf_counter() - wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="W1,W2")
    args = ap.parse_args()
    resolved = resolve_model(None)
    llm = LLM(
        dtype=args.dtype,
        max_num_seqs=64,
        max_model_len=1024,
        enable_lora=True,
        max_loras=16,
        max_lora_rank=8,
    )
    prompts, lengths = word_workload(llm, args.num_requests, 0)
    paths = kept_adapters(resolved, 16)
    rng = random.Random(0)
    adapters = [LoRARequest(f"a{i}", i + 1, str(p)) for i, p in enumerate(paths)]
    w2 = [adapters[power_law_choice(rng, 16, 0.3)] for _ in prompts]
    print(f"{args.dtype}, {args.num_requests} requests; CPU ms per token (wall tok/s)\n")
    print("| workload | native off | native on | CPU-time speedup |\n|---|---|---|---|")
    for name in args.workloads.split(","):
        loras = None if name == "W1" else w2
        run(llm, prompts[:8], lengths[:8], None if loras is None else loras[:8])  # warm up
        off, on = [], []
        for _ in range(args.rounds):
            with natives_off():
                off.append(run(llm, prompts, lengths, loras))
            on.append(run(llm, prompts, lengths, loras))
        o_cpu, o_tok = (statistics.median(v) for v in zip(*off, strict=True))
        n_cpu, n_tok = (statistics.median(v) for v in zip(*on, strict=True))
        print(
            f"| {name} | {o_cpu:.2f} ({o_tok:.0f}) | {n_cpu:.2f} ({n_tok:.0f}) "
            f"| {o_cpu / n_cpu:.2f}x |"
        )


if __name__ == "__main__":
    main()

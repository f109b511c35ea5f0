"""loragate's engine against vLLM's CPU backend on the same requests, in one run (issue 23).

The same token ids go to both: W1, 64 chat requests with 32-96 output tokens on the base
model; W2, the same requests spread over 16 rank-8 adapters on all seven projections with
power-law popularity. Greedy, EOS ignored, at most 64 sequences, in one dtype on both sides.
vLLM runs in its own venv (`../shared/peers/setup_vllm.sh`), called as a subprocess through
`peer_vllm.py`; both time only the generate call, after a warm-up that touches every adapter.

    .venv/bin/python benchmarks/vs_vllm.py --dtype bfloat16 \\
        --vllm-python ~/.cache/loragate-peers/vllm/bin/python \\
        --peer-script ../shared/peers/peer_vllm.py

`--rounds N` runs loragate's W1 and W2 in turns N times and keeps each one's best (a busy
neighbour or the first run's warm-up slows one round, not the figure).

`--w3` runs W3 instead (benchmarks/w3_mixed_ranks.py): 64 adapters of ranks 8-128 on all
seven projections, 128 requests, vLLM-CPU with max_loras 64 and max_lora_rank 128; it prints
the adapter bytes each step reads and the memory bandwidth measured in the same run, so the
LoRA time can be set against its memory bound. That pair of runs (W3 and its requests with no
adapters) has prefix caching off: W3's requests share prefixes only within an adapter.

`--model DIR` runs another model (an HF directory, e.g. one benchmarks/random_llama.py made
with Qwen3's or Gemma 3's shapes) on both sides.

Issue 59's quantized bases, loragate's side only (vLLM-CPU keeps `--dtype`):
`--quantization int8|int4` quantizes the base at load, `--activation-quantization int8` adds
the optional int8-activation mode, and `--gguf-dequantize` serves a GGUF base (the default
model's Q4_1 included) as a float copy, loragate's own float32 W1/W2 to set the block
formats against.
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from datetime import date
from pathlib import Path

from harness import TARGETS, kept_adapters
from offline_peer import run_peer_vllm
from offline_workloads import power_law_choice, topic_requests
from w3_mixed_ranks import (
    W3_ADAPTERS,
    StepAdapters,
    adapter_bytes,
    make_w3_adapters,
    stream_bandwidth_gb_s,
    w3_requests,
)

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.cpu_features import bf16_support
from loragate.tools.base_model import resolve_base_model

NUM_ADAPTERS = 16
POWER_LAW_ALPHA = 0.3


def workloads(llm: LLM, n: int, seed: int) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    base = []
    for messages, _ in topic_requests(n, seed):
        prompt = llm.apply_chat_template(messages)
        base.append({"prompt_token_ids": prompt, "max_tokens": rng.randint(32, 96)})
    spread = [{**r, "adapter": power_law_choice(rng, NUM_ADAPTERS, POWER_LAW_ALPHA)} for r in base]
    return {"W1 base": [{**r, "adapter": None} for r in base], "W2 16 adapters": spread}


def weight_types(llm: LLM) -> str:
    """The base's resident bytes by tensor type, as the engine accounts them."""
    held = llm.llm_engine.model.weight_bytes()
    return ", ".join(f"{kind} {n / 1e6:.1f} MB" for kind, n in sorted(held.items()))


def run_loragate(llm: LLM, requests: list[dict], loras: list[LoRARequest]) -> float:
    def run(rs):
        params = [
            SamplingParams(temperature=0, max_tokens=r["max_tokens"], ignore_eos=True) for r in rs
        ]
        lr = [None if r["adapter"] is None else loras[r["adapter"]] for r in rs]
        prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in rs]
        return llm.generate(prompts, params, lora_request=lr, use_tqdm=False)

    used = sorted({r["adapter"] for r in requests if r["adapter"] is not None})
    first = requests[0]["prompt_token_ids"][:16]
    run([{"prompt_token_ids": first, "max_tokens": 2, "adapter": a} for a in [None, *used]])
    start = time.perf_counter()
    outs = run(requests)
    seconds = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds


def run_vllm(
    args,
    requests: list[dict],
    adapter_dir: Path,
    glob: str = "r8-*",
    max_loras: int = NUM_ADAPTERS,
    max_rank: int = 8,
) -> float:
    options = [
        "--adapters",
        str(adapter_dir),
        "--glob",
        glob,
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_rank),
        "--dtype",
        args.dtype,
    ]
    if args.model:
        options += ["--model", str(Path(args.model).resolve())]
    return run_peer_vllm(args.vllm_python, args.peer_script, requests, options)["tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1, help="loragate's W1 and W2 in turns; best")
    ap.add_argument("--model", help="an HF directory (default: the default model)")
    ap.add_argument("--w3", action="store_true", help="run W3 (mixed ranks) instead")
    ap.add_argument("--quantization", choices=["int8", "int4"], help="loragate's base at load")
    ap.add_argument("--activation-quantization", choices=["int8"], help="loragate only")
    ap.add_argument("--gguf-dequantize", action="store_true", help="a GGUF base as floats")
    ap.add_argument("--vllm-python", help="the peer venv's python; without it, loragate only")
    ap.add_argument("--peer-script", help="peer_vllm.py (../shared/peers/ in the workplace)")
    args = ap.parse_args()
    if args.vllm_python and not args.peer_script:
        ap.error("--vllm-python needs --peer-script")

    if args.w3:
        run_w3(args)
        return
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_num_seqs=64,
        enable_lora=True,
        max_loras=NUM_ADAPTERS,
        max_cpu_loras=NUM_ADAPTERS,
        max_lora_rank=8,
        quantization=args.quantization,
        activation_quantization=args.activation_quantization,
        gguf_dequantize=args.gguf_dequantize,
    )
    paths = kept_adapters(resolve_base_model(args.model), NUM_ADAPTERS)
    loras = [LoRARequest(p.name, i + 1, str(p)) for i, p in enumerate(paths)]
    support = bf16_support()
    print(
        f"machine: {platform.processor() or platform.machine()}, {date.today()}, "
        f"native bf16: {support.native} ({support.reason}), dtype {args.dtype}"
    )
    print(f"base weights held: {weight_types(llm)}")
    print(f"targets: {', '.join(TARGETS)}")
    rows = []
    loads = workloads(llm, args.num_requests, args.seed)
    best = {name: 0.0 for name in loads}
    for round_ in range(args.rounds):  # W1 and W2 in turns: a load change hits both
        for name, requests in loads.items():
            ours = run_loragate(llm, requests, loras)
            best[name] = max(best[name], ours)
            print(f"round {round_ + 1}, {name}: loragate {ours:.1f} tok/s", flush=True)
    for name, requests in loads.items():
        theirs = run_vllm(args, requests, paths[0].parent) if args.vllm_python else None
        rows.append((name, best[name], theirs))
        line = f"{name}: loragate {best[name]:.1f} tok/s (best of {args.rounds})"
        print(line + (f", vLLM-CPU {theirs:.1f}" if theirs else ""))
    print(f"\n| workload ({args.dtype}) | loragate tok/s | vLLM-CPU tok/s | ratio |")
    print("|---|---|---|---|")
    for name, ours, theirs in rows:
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        print(f"| {name} | {ours:.1f} | {theirs or '-'} | {ratio} |")
    base, spread = rows[0][1], rows[1][1]
    print(f"\nLoRA's cost on loragate: {100 * (1 - spread / base):.0f}% of base throughput")


def run_w3(args) -> None:
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        max_num_seqs=64,
        enable_lora=True,
        max_loras=W3_ADAPTERS,
        max_cpu_loras=W3_ADAPTERS,
        max_lora_rank=128,
    )
    engine = llm.llm_engine
    paths = make_w3_adapters(resolve_base_model(args.model))
    loras = [LoRARequest(p.name, i + 1, str(p)) for i, p in enumerate(paths)]
    sizes = {p.name: adapter_bytes(p, Path(engine.hf_dir), engine.model.dtype) for p in paths}
    base = workloads(llm, args.num_requests, args.seed)["W1 base"]
    requests = w3_requests(base, args.seed)
    unadapted = [{**r, "adapter": None} for r in requests]
    tokens = sum(r["max_tokens"] for r in requests)
    bandwidth = stream_bandwidth_gb_s()
    base_tok_s = run_loragate(llm, unadapted, loras)
    watch = StepAdapters(engine)
    ours = run_loragate(llm, requests, loras)
    watch.stop()
    print(f"W3: loragate {ours:.1f} tok/s, without adapters {base_tok_s:.1f}", flush=True)
    theirs = (
        run_vllm(args, requests, paths[0].parent, "w3-*", W3_ADAPTERS, 128)
        if args.vllm_python
        else None
    )
    # The memory bound's pair of runs computes every prompt token on both sides: with prefix
    # caching on, the 128 requests (W1's 64 twice) share prefixes across all of them
    # without adapters but only within one adapter in W3, and the difference (2,465 more
    # prompt tokens of 5,888 on 2026-11-28) is KV computed again, not LoRA's time.
    engine.block_manager.enable_prefix_caching = False
    uncached_base = run_loragate(llm, unadapted, loras)
    watch = StepAdapters(engine)
    uncached = run_loragate(llm, requests, loras)
    watch.stop()
    engine.block_manager.enable_prefix_caching = True
    steps = [s for s in watch.steps if s]
    per_step = sum(sum(sizes[n] for n in s) for s in steps) / max(len(steps), 1)
    lora_seconds = tokens / uncached - tokens / uncached_base
    bound_seconds = len(steps) * per_step / (bandwidth * 1e9)
    support = bf16_support()
    print(
        f"machine: {platform.processor() or platform.machine()}, {date.today()}, "
        f"native bf16: {support.native} ({support.reason}), dtype {args.dtype}"
    )
    print(f"base weights held: {weight_types(llm)}")
    print(f"memory bandwidth (copy): {bandwidth:.1f} GB/s")
    print(f"\n| W3 ({args.dtype}) | loragate tok/s | vLLM-CPU tok/s | ratio |")
    print("|---|---|---|---|")
    ratio = f"{ours / theirs:.2f}x" if theirs else "-"
    print(f"| W3 64 adapters, ranks 8-128 | {ours:.1f} | {theirs or '-'} | {ratio} |")
    print(f"| the same requests, no adapters | {base_tok_s:.1f} | | |")
    print(f"| W3, prefix caching off | {uncached:.1f} | | |")
    print(f"| the same requests, no adapters, prefix caching off | {uncached_base:.1f} | | |")
    print(
        f"\nLoRA's cost: {100 * (1 - ours / base_tok_s):.0f}% "
        f"({100 * (1 - uncached / uncached_base):.0f}% with prefix caching off); with it off, "
        f"{len(steps)} steps read {per_step / 2**20:.0f} MiB of adapter weights each on "
        f"average; LoRA time {lora_seconds:.1f} s against {bound_seconds:.1f} s to read those "
        f"bytes once a step ({lora_seconds / bound_seconds:.2f}x the memory bound)"
    )


if __name__ == "__main__":
    main()

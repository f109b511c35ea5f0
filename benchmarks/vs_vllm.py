"""loragate's engine against vLLM's CPU backend on the same requests, in one run (issue 23).

The same token ids go to both: W1, 64 chat requests with 32-96 output tokens on the base
model; W2, the same requests spread over 16 rank-8 adapters on all seven projections with
power-law popularity. Greedy, EOS ignored, at most 64 sequences, in one dtype on both sides.
vLLM runs in its own venv (`../shared/peers/setup_vllm.sh`), called as a subprocess through
`peer_vllm.py`; both time only the generate call, after a warm-up that touches every adapter.

    .venv/bin/python benchmarks/vs_vllm.py --dtype bfloat16 \\
        --vllm-python ~/.cache/loragate-peers/vllm/bin/python \\
        --peer-script ../shared/peers/peer_vllm.py
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from multi_lora import TARGETS, make_adapters, power_law_choice
from throughput import make_requests

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.cpu_features import bf16_support

NUM_ADAPTERS = 16
POWER_LAW_ALPHA = 0.3


def workloads(llm: LLM, n: int, seed: int) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    base = []
    for messages, _ in make_requests(n, seed):
        prompt = llm.apply_chat_template(messages)
        base.append({"prompt_token_ids": prompt, "max_tokens": rng.randint(32, 96)})
    spread = [{**r, "adapter": power_law_choice(rng, NUM_ADAPTERS, POWER_LAW_ALPHA)} for r in base]
    return {"W1 base": [{**r, "adapter": None} for r in base], "W2 16 adapters": spread}


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


def run_vllm(args, requests: list[dict], adapter_dir: Path) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(requests, file)
    command = [
        args.vllm_python,
        str(Path(args.peer_script).resolve()),
        "--requests",
        file.name,
        "--adapters",
        str(adapter_dir),
        "--glob",
        "r8-*",
        "--max-loras",
        str(NUM_ADAPTERS),
        "--max-lora-rank",
        "8",
        "--dtype",
        args.dtype,
    ]
    # Run outside benchmarks/: vLLM imports a module named `kernels`, and this folder has one.
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir()
    )
    if done.returncode != 0:
        sys.exit(f"vLLM peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-python", help="the peer venv's python; without it, loragate only")
    ap.add_argument("--peer-script", help="peer_vllm.py (../shared/peers/ in the workplace)")
    args = ap.parse_args()
    if args.vllm_python and not args.peer_script:
        ap.error("--vllm-python needs --peer-script")

    llm = LLM(
        dtype=args.dtype,
        max_num_seqs=64,
        enable_lora=True,
        max_loras=NUM_ADAPTERS,
        max_cpu_loras=NUM_ADAPTERS,
        max_lora_rank=8,
    )
    paths = make_adapters(Path(llm.llm_engine.hf_dir), NUM_ADAPTERS, llm.llm_engine.model_name)
    loras = [LoRARequest(p.name, i + 1, str(p)) for i, p in enumerate(paths)]
    support = bf16_support()
    print(
        f"machine: {platform.processor() or platform.machine()}, {date.today()}, "
        f"native bf16: {support.native} ({support.reason}), dtype {args.dtype}"
    )
    print(f"targets: {', '.join(TARGETS)}")
    rows = []
    for name, requests in workloads(llm, args.num_requests, args.seed).items():
        ours = run_loragate(llm, requests, loras)
        theirs = run_vllm(args, requests, paths[0].parent) if args.vllm_python else None
        rows.append((name, ours, theirs))
        print(f"{name}: loragate {ours:.1f} tok/s" + (f", vLLM-CPU {theirs:.1f}" if theirs else ""))
    print(f"\n| workload ({args.dtype}) | loragate tok/s | vLLM-CPU tok/s | ratio |")
    print("|---|---|---|---|")
    for name, ours, theirs in rows:
        ratio = f"{ours / theirs:.2f}x" if theirs else "-"
        print(f"| {name} | {ours:.1f} | {theirs or '-'} | {ratio} |")
    base, spread = rows[0][1], rows[1][1]
    print(f"\nLoRA's cost on loragate: {100 * (1 - spread / base):.0f}% of base throughput")


if __name__ == "__main__":
    main()

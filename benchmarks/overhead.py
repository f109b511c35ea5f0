"""The engine's own time per step, against vLLM-CPU on the same machine (issue 36).

A tiny random Llama (2 layers of width 64, SmolLM2's 49,152-token vocabulary): its layers
cost microseconds, so a step's time is the output layer, the argmax and everything the
engine does around the model (scheduling, the batch's inputs, sampling, stop checks,
detokenizing, outputs). 64 sequences of 32 prompt tokens each generate 128 tokens, greedy,
EOS ignored, in one dtype on both sides. loragate's per-step breakdown comes from its step
records (engine/core/step_record.py), and the offline LLM's output processing (detokenizing, stop
strings, outputs), which runs inline after each step here and on the async engine's output
thread when serving, is timed per step as its own column. vLLM's time per step is its
generate call's time over the 128 steps a batch of 64 needs (one prefill step, then decodes).

    .venv/bin/python benchmarks/overhead.py \\
        --vllm-python ~/.cache/loragate-peers/vllm/bin/python \\
        --peer-script ../shared/peers/peer_vllm.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from harness import spread_token_ids
from offline_peer import run_peer_vllm
from random_llama import make_random_llama

from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.cpu_features import bf16_support

NUM_SEQS = 64
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 128
PHASES = ("schedule", "prepare", "forward", "sample", "output")


def requests(seed: int = 0) -> list[dict]:
    """The same token ids for both engines."""
    return [
        {
            "prompt_token_ids": spread_token_ids(i, PROMPT_TOKENS, seed),
            "max_tokens": OUTPUT_TOKENS,
            "adapter": None,
        }
        for i in range(NUM_SEQS)
    ]


def run_loragate(model_dir: Path, dtype: str, reqs: list[dict], repeats: int) -> dict:
    llm = LLM(model=str(model_dir), dtype=dtype, max_num_seqs=NUM_SEQS, max_model_len=512)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    prompts = [{"prompt_token_ids": r["prompt_token_ids"]} for r in reqs]
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    inline = timed_output_processing(engine)
    best = None
    for _ in range(repeats):
        first = len(engine.step_records)
        inline.clear()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        records = list(engine.step_records)[first:]
        assert sum(len(o.outputs[0].token_ids) for o in outs) == NUM_SEQS * OUTPUT_TOKENS
        if best is None or seconds < best[0]:
            best = (seconds, records, list(inline))
    seconds, records, outputs_ms = best
    decodes = [r for r in records if not r.prefill_tokens]
    return {
        "seconds": seconds,
        "steps": len(records),
        "ms_per_step": seconds * 1e3 / len(records),
        "decode_step_median_ms": statistics.median(r.ms for r in decodes),
        "phases_median_ms": {
            phase: statistics.median(dict(r.phases).get(phase, 0.0) for r in decodes)
            for phase in PHASES
        },
        "output_processing_median_ms": statistics.median(outputs_ms),
    }


def timed_output_processing(engine) -> list[float]:
    """Milliseconds of each step's output processing from now on (the engine's own method,
    timed where the offline LLM calls it)."""
    spent: list[float] = []
    process = engine.process_outputs

    def timed(step):
        started = time.perf_counter()
        outputs = process(step)
        spent.append((time.perf_counter() - started) * 1e3)
        return outputs

    engine.process_outputs = timed
    return spent


def run_vllm(args, model_dir: Path, reqs: list[dict]) -> dict:
    empty = Path(tempfile.mkdtemp(prefix="no-adapters-"))
    options = ["--adapters", str(empty), "--model", str(model_dir), "--dtype", args.dtype]
    best = None
    for _ in range(args.repeats):
        seconds = run_peer_vllm(args.vllm_python, args.peer_script, reqs, options)["seconds"]
        best = seconds if best is None else min(best, seconds)
    return {"seconds": best, "ms_per_step": best * 1e3 / OUTPUT_TOKENS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "loragate-tiny-llama"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine; the fastest counts")
    ap.add_argument("--vllm-python", help="the peer venv's python; without it, loragate only")
    ap.add_argument("--peer-script", help="peer_vllm.py (../shared/peers/ in the workplace)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line")
    args = ap.parse_args()
    if args.vllm_python and not args.peer_script:
        ap.error("--vllm-python needs --peer-script")
    if not (args.model_dir / "config.json").exists():
        make_random_llama("tiny", args.model_dir, torch.float32)
    reqs = requests()
    ours = run_loragate(args.model_dir, args.dtype, reqs, args.repeats)
    theirs = run_vllm(args, args.model_dir, reqs) if args.vllm_python else None
    if args.json:
        print(json.dumps({"loragate": ours, "vllm": theirs}))
        return
    support = bf16_support()
    print(
        f"machine: {platform.processor() or platform.machine()}, {date.today()}, "
        f"load average {os.getloadavg()[0]:.2f}, native bf16: {support.native}, "
        f"dtype {args.dtype}"
    )
    print(f"\n| tiny Llama, {NUM_SEQS} x {OUTPUT_TOKENS} tokens | loragate | vLLM-CPU | ratio |")
    print("|---|---|---|---|")
    vllm_ms = f"{theirs['ms_per_step']:.1f}" if theirs else "-"
    ratio = f"{ours['ms_per_step'] / theirs['ms_per_step']:.2f}" if theirs else "-"
    print(f"| ms per step (run time / steps) | {ours['ms_per_step']:.1f} | {vllm_ms} | {ratio} |")
    print(f"\nloragate's decode step, median {ours['decode_step_median_ms']:.2f} ms:")
    print("| " + " | ".join(PHASES) + " | output processing (inline) |")
    print("|" + "---|" * (len(PHASES) + 1))
    phases = " | ".join(f"{ours['phases_median_ms'][p]:.2f}" for p in PHASES)
    print(f"| {phases} | {ours['output_processing_median_ms']:.2f} |")


if __name__ == "__main__":
    main()

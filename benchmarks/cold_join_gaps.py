"""Cold adapters joining running streams, as issue 47's goal states it: 4 cold rank-64
adapters (all seven projections) requested while 8 streams decode, the worst token gap of
the streams against their median gap (goal: at most 2x).

The wall-clock side of tests/engine/test_adapter_cold_start.py (which proves the property
from the step records and where each read ran), in the dtype asked for and with the step
records printed: each run is a fresh engine on the default model (SmolLM2-135M);
8 base streams decode, after their 8th token four requests arrive at once for four adapters
in no memory tier (read from local disk), each decodes 32 tokens, and the streams leave a
few tokens after the last of them. Then the same engine runs the streams alone for as many
tokens, so a machine that stalls streams by itself shows it. From the step records of the
window: the median step, the longest step with its phases, and the steps that ran a cold
request's prompt.

    .venv/bin/python benchmarks/cold_join_gaps.py --runs 3 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from harness import (
    STREAMS,
    add_dtype,
    add_window_share,
    load_average,
    lora_engine,
    machine_line,
    print_table,
    random_adapters,
    stream_prompt,
    token_gaps,
)

from loragate.adapters import LoRARequest
from loragate.adapters.pacing import WINDOW_SHARE
from loragate.engine import SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine

COLD = 4
STREAM_TOKENS = 900
COLD_TOKENS = 32
BURST_AFTER = 8


async def beside_cold(engine, base_prompts, cold_prompts, loras) -> list[list[float]]:
    stream = SamplingParams(temperature=0, max_tokens=STREAM_TOKENS, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=COLD_TOKENS, min_tokens=COLD_TOKENS)
    stamps: list[list[float]] = [[] for _ in base_prompts]
    enough, cold_done = asyncio.Event(), asyncio.Event()

    async def base(i: int):
        after = 0
        request = {"prompt_token_ids": base_prompts[i]}
        async for out in engine.generate(request, stream, f"base{i}"):
            stamps[i].append(time.monotonic())
            if len(out.outputs[0].token_ids) >= BURST_AFTER:
                enough.set()
            after += cold_done.is_set()
            if after > 4 or out.finished:
                break

    async def cold(i: int):
        await enough.wait()
        request = {"prompt_token_ids": cold_prompts[i]}
        async for out in engine.generate(request, greedy, f"cold{i}", lora_request=loras[i]):
            assert out.error is None, out.error

    async def colds():
        await asyncio.gather(*(cold(i) for i in range(len(cold_prompts))))
        cold_done.set()

    await asyncio.gather(*(base(i) for i in range(len(base_prompts))), colds())
    while engine.num_requests:
        await asyncio.sleep(0.01)
    return stamps


async def alone(engine, base_prompts, tokens: int) -> list[list[float]]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    stamps: list[list[float]] = [[] for _ in base_prompts]

    async def base(i: int):
        async for _ in engine.generate({"prompt_token_ids": base_prompts[i]}, params, f"q{i}"):
            stamps[i].append(time.monotonic())

    await asyncio.gather(*(base(i) for i in range(len(base_prompts))))
    return stamps


def one_run(dtype: str, paths: list[Path], run: int, share: float = WINDOW_SHARE) -> dict:
    llm = lora_engine(
        dtype,
        64,
        COLD,
        COLD,
        max_model_len=STREAM_TOKENS + 64,
        kv_cache_memory_gb=0.75,
        adapter_load_window_share=share,
    )
    inner = llm.llm_engine
    base_prompts = [stream_prompt(inner, str(run), i) for i in range(STREAMS)]
    cold_prompts = [inner.encode(f"Name a color. ({run} {i})") for i in range(COLD)]
    loras = [LoRARequest(f"cold{run}-{i}", i + 1, str(p)) for i, p in enumerate(paths)]
    engine = AsyncLLMEngine(inner)
    try:
        first = inner.step_records[-1].index + 1 if inner.step_records else 0
        stamps = asyncio.run(beside_cold(engine, base_prompts, cold_prompts, loras))
        records = [r for r in inner.step_records if r.index >= first]
        quiet = asyncio.run(alone(engine, base_prompts, max(len(s) for s in stamps)))
    finally:
        engine.shutdown()
    stats = inner.residency.counts()
    assert stats["disk_loads"] == COLD, stats
    cold_seqs = {seq for r in records for seq, _ in r.prefill_chunks if r.decode_seq_ids}
    joins = [r for r in records if r.prefill_tokens and r.decode_seq_ids]
    longest = max(records, key=lambda r: r.ms)
    g, q = token_gaps(stamps), token_gaps(quiet)
    return {
        "median": statistics.median(g) * 1e3,
        "worst": max(g) * 1e3,
        "alone_median": statistics.median(q) * 1e3,
        "alone_worst": max(q) * 1e3,
        "step_median": statistics.median(r.ms for r in records),
        "join_steps": [round(r.ms, 1) for r in joins],
        "cold_prefills": len(cold_seqs),
        "longest": (
            round(longest.ms, 1),
            longest.prefill_tokens,
            len(longest.decode_seq_ids),
            {k: round(v, 1) for k, v in longest.phases},
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    add_dtype(ap, "bfloat16")
    add_window_share(ap)
    args = ap.parse_args()
    print(machine_line() + f"; dtype {args.dtype}", flush=True)
    with tempfile.TemporaryDirectory() as root:
        paths = random_adapters(Path(root), COLD * args.runs)
        results = []
        for run in range(args.runs):
            load = load_average()
            chosen = paths[run * COLD : (run + 1) * COLD]
            result = one_run(args.dtype, chosen, run, args.window_share)
            results.append(result)
            print(f"run {run} (load average {load:.2f} before): {result}", flush=True)
    print(
        f"\n# dtype {args.dtype}; {COLD} cold rank-64 adapters beside {STREAMS} streams; "
        f"window share {args.window_share}; load average after {load_average():.2f}"
    )
    rows = []
    for run, r in enumerate(results):
        ratio, quiet = r["worst"] / r["median"], r["alone_worst"] / r["alone_median"]
        alone = f"{r['alone_worst']:.0f} / {r['alone_median']:.0f} = {quiet:.2f}x"
        rows.append([run, f"{r['worst']:.0f}", f"{r['median']:.0f}", f"{ratio:.2f}x", alone])
    header = ["run", "worst gap ms", "median gap ms", "worst / median", "alone: worst / median"]
    print_table(header, rows)


if __name__ == "__main__":
    main()

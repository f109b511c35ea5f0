"""First token of a request beside running streams as the server serves it: through the async
engine (the gateway's engine), where a cold adapter is read on a loader thread, paced while
the streams run (adapters/pacing.py), and the streams never wait for it.

benchmarks/first_token.py times the offline engine, whose `add_request` reads a cold adapter
on the engine's own thread, unpaced, while the running streams wait. This is the other side
of issue 47's two goals: the same shapes (rank 64 on all seven projections, `--rank` for
another; a 256-token prompt; 8 base streams decoding), base, warm and cold requests in turns,
a fresh random adapter for each cold one, and beside each request the streams' median token
gap while it waited for its first token against their median gap before it (what the paced
load, or the prompt's chunks beside them, cost the streams).

    .venv/bin/python benchmarks/first_token_served.py --rounds 5 --dtype float32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from first_token import PROMPT_TOKENS
from harness import (
    STREAMS,
    add_dtype,
    add_window_share,
    lora_engine,
    machine_line,
    print_table,
    random_adapters,
    stream_prompt,
)

from loragate.adapters import LoRARequest
from loragate.engine import SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine

KINDS = ("base", "warm", "cold")  # first_token.py's shapes; no store row here


async def one_round(engine, inner, words, warm, cold, r: int) -> dict[str, tuple]:
    """Each kind's seconds to its first token, the streams' median token gap while it
    waited against their median gap before it, and the windows the engine lent adapter loads
    while it waited (count, seconds), with 8 streams decoding throughout."""
    stamps: list[list[float]] = [[] for _ in range(STREAMS)]
    done = asyncio.Event()
    stream = SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)

    async def base(i: int):
        prompt = {"prompt_token_ids": stream_prompt(inner, f"s{r}", i)}
        async for _ in engine.generate(prompt, stream, f"s{r}-{i}"):
            stamps[i].append(time.monotonic())
            if done.is_set():
                break

    async def probes() -> dict[str, tuple]:
        while min(len(s) for s in stamps) < 4:
            await asyncio.sleep(0.01)
        found, lent = {}, {}
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        for kind, lora in (("base", None), ("warm", warm), ("cold", cold)):
            prompt = {"prompt_token_ids": [words[0] + r + len(found), *words[1:PROMPT_TOKENS]]}
            windows = inner.residency.windows
            lent_before = (windows.lent, windows.lent_seconds)
            start = time.monotonic()
            async for _ in engine.generate(prompt, one, f"{kind}{r}", lora_request=lora):
                break
            end = time.monotonic()
            lent[kind] = (windows.lent - lent_before[0], windows.lent_seconds - lent_before[1])
            pairs = [(a, b) for s in stamps for a, b in zip(s, s[1:], strict=False)]
            waited = [b - a for a, b in pairs if start < b <= end] or [float("nan")]
            before = [b - a for a, b in pairs if b <= start] or [float("nan")]
            found[kind] = (
                end - start,
                statistics.median(waited) / statistics.median(before),
                *lent[kind],
            )
            await asyncio.sleep(0.3)  # a few steps of the streams alone between probes
        done.set()
        return found

    results = await asyncio.gather(probes(), *(base(i) for i in range(STREAMS)))
    while engine.num_requests:
        await asyncio.sleep(0.01)
    return results[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    add_dtype(ap, "float32")
    ap.add_argument("--rank", type=int, default=64, help="the adapters' rank")
    ap.add_argument(
        "--cpu-tier",
        type=int,
        default=8,
        help="adapters the CPU tier holds (below rounds + 1: cold loads evict, as on a server "
        "whose tier is full, and a load's memory may be an evicted adapter's)",
    )
    add_window_share(ap)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as root:
        paths = random_adapters(Path(root), 1 + args.rounds, args.rank)
        llm = lora_engine(
            args.dtype,
            args.rank,
            min(4, args.cpu_tier),
            args.cpu_tier,
            max_model_len=4400,
            kv_cache_memory_gb=1.5,
            adapter_load_window_share=args.window_share,
        )
        inner = llm.llm_engine
        warm = LoRARequest("warm", 1, str(paths[0]))
        inner.residency.preload(warm)
        words = inner.encode(" ".join(["lighthouse"] * (2 * PROMPT_TOKENS)))
        engine = AsyncLLMEngine(inner)
        rounds = []
        try:
            for r in range(args.rounds):
                cold = LoRARequest(f"cold{r}", 2 + r, str(paths[1 + r]))
                rounds.append(asyncio.run(one_round(engine, inner, words, warm, cold, r)))
        finally:
            engine.shutdown()

    print(machine_line() + f"; dtype {args.dtype}")
    print(
        f"# {args.rounds} rounds; rank {args.rank} on all projections, {PROMPT_TOKENS}-token"
        f" prompt, a CPU tier of {args.cpu_tier} adapters"
    )
    print(f"# {STREAMS} streams decoding; through the async engine (cold: read on a loader thread)")
    print("# windows: those the engine lent adapter loads between steps while it waited")
    medians, rows = {}, []
    for kind in KINDS:
        medians[kind] = statistics.median(found[kind][0] for found in rounds) * 1e3
        slowed = statistics.median(found[kind][1] for found in rounds)
        count = statistics.median(found[kind][2] for found in rounds)
        ms = statistics.median(found[kind][3] for found in rounds) * 1e3
        rows.append([kind, f"{medians[kind]:.1f}", f"{slowed:.2f}x", f"{count:g}", f"{ms:.0f}"])
    header = ["request", "first token ms (median)"]
    header += ["streams' median gap while it waited / before", "windows (median)"]
    print_table([*header, "windows' ms (median)"], rows)
    print(f"warm / base {medians['warm'] / medians['base']:.2f} (goal <= 1.2); ", end="")
    print(f"cold / warm {medians['cold'] / medians['warm']:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()

"""First token of a request beside running streams: the base model's, a warm adapter's (in
the CPU tier, so its slot borrows it in place), a cold one's (read from local disk) and one
cold from the adapter store, as issue 47 asks: rank 64 on all seven projections (`--rank` for
another), a 256-token prompt, 8 base streams decoding.

The adapter cold from the store is named by its object (`adapter-store:<oid>`) in a local
directory store (adapters/store.py) the engine's `AdapterFetcher` has not checked yet, so its
first token includes the fetch (with a local store: the object's directory, nothing copied),
the check of its files against the id and the read, which takes the check's word for their
hash. Its objects, a fresh random adapter per round, are put into the store before the engine
starts, as an upload is before its first request: files written less than RACY_NS (2 s,
adapters/identity.py) before their check are hashed again when read, which this row leaves out.

One engine on the default model (SmolLM2-135M). Each round starts the 8 streams, then sends
the four requests one at a time in turns (base, warm, cold, store, base, ...), so a load
change on the machine hits all four alike; a request's first token is the wall time from
`add_request` to the step that returns its first token, with the steps in between run as
the server runs them (`step_tokens`). The last step's phases come from the step records;
the LoRA time of all the steps until the first token from a timer around the LoRA calls
(`LoRATimer`: every projection's `kernels.lora_apply_modules`, and the part of it spent in
products on long runs of one adapter, kernels/lora_segment_gemm.py; the rest is the native
loop's), and the prompt's chunks (rows per step) from the step records.

    .venv/bin/python benchmarks/first_token.py --rounds 5 --dtype float32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import (
    add_dtype,
    lora_engine,
    machine_line,
    print_table,
    random_adapters,
    start_streams,
    stop_streams,
)

from loragate import kernels
from loragate.adapters import LoRARequest
from loragate.adapters.identity import RACY_NS
from loragate.adapters.store import AdapterFetcher, identity_of, object_id, open_store
from loragate.engine import LLM, SamplingParams, store_path
from loragate.kernels import lora_modules

PROMPT_TOKENS = 256
KINDS = {"base": "base", "warm": "warm", "cold": "cold", "store": "cold from the store"}


class LoRATimer:
    """Milliseconds inside the model's LoRA calls since `reset`: all of them, and those of
    the products on long runs (the model reads `kernels.lora_apply_modules` on each call and
    lora_modules its `apply_long_segments`, so wrapping the names times them)."""

    def __init__(self) -> None:
        self.lora_ms = self.products_ms = 0.0
        self._wrap(kernels, "lora_apply_modules", "lora_ms")
        self._wrap(lora_modules, "apply_long_segments", "products_ms")

    def _wrap(self, module, name: str, total: str) -> None:
        real = getattr(module, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                setattr(self, total, getattr(self, total) + (time.perf_counter() - start) * 1e3)

        setattr(module, name, timed)

    def reset(self) -> None:
        self.lora_ms = self.products_ms = 0.0


def first_token(llm: LLM, prompt: list[int], tag: str, lora: LoRARequest | None, timer):
    """Seconds to the request's first token, the phases of the step that gave it, its wall
    ms, the LoRA ms of all the steps until then (all, products) and the prompt's chunks."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    timer.reset()
    start = time.perf_counter()
    engine.add_request(tag, {"prompt_token_ids": prompt}, params, lora_request=lora)
    chunks = []
    while True:
        output = engine.step_tokens()
        chunks += [n for _, n in engine.step_records[-1].prefill_chunks if n > 1]
        if any(r.request.request_id == tag and r.seqs[0].results for r in output.requests):
            seconds = time.perf_counter() - start
            break
    record = engine.step_records[-1]
    engine.abort_request(tag)
    lora_ms = {"lora": timer.lora_ms, "products": timer.products_ms}
    return seconds, dict(record.phases), record.ms, lora_ms, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    add_dtype(ap, "float32")
    ap.add_argument("--rank", type=int, default=64, help="the adapters' rank")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as root:
        paths = random_adapters(Path(root), 1 + 2 * args.rounds, args.rank)
        cache_dir = Path(root) / "cache"
        store = open_store(str(Path(root) / "store"), cache_dir)
        oids = [object_id(identity_of(path)) for path in paths[1 + args.rounds :]]
        for oid, path in zip(oids, paths[1 + args.rounds :], strict=True):
            store.put(oid, path)
        put_at = time.monotonic()
        fetcher = AdapterFetcher(store, cache_dir)
        llm = lora_engine(args.dtype, args.rank, 4, 8, adapter_fetcher=fetcher)
        time.sleep(max(0.0, RACY_NS / 1e9 - (time.monotonic() - put_at)))  # objects put earlier
        engine = llm.llm_engine
        timer = LoRATimer()
        warm = LoRARequest("warm", 1, str(paths[0]))
        engine.residency.preload(warm)
        words = engine.encode(" ".join(["lighthouse"] * (2 * PROMPT_TOKENS)))
        results: dict[str, list] = {name: [] for name in KINDS}
        for r in range(args.rounds):
            streams = start_streams(engine, f"s{r}", max_tokens=1000)
            for _ in range(4):
                engine.step_tokens()
            cold = LoRARequest(f"cold{r}", 2 + r, str(paths[1 + r]))
            stored = LoRARequest(f"store{r}", 2 + args.rounds + r, store_path(oids[r]))
            for name, lora in (("base", None), ("warm", warm), ("cold", cold), ("store", stored)):
                prompt = [words[0] + r, *words[1:PROMPT_TOKENS]]  # no prefix-cache hit
                results[name].append(first_token(llm, prompt, f"{name}{r}", lora, timer))
                for _ in range(3):
                    engine.step_tokens()
            stop_streams(engine, streams)
        unhashed = engine.residency.counts()["vouched_reads"]  # the store's objects

    print(machine_line() + f"; dtype {args.dtype}")
    shape = f"rank {args.rank} on all projections, {PROMPT_TOKENS}-token prompt"
    print(f"# {args.rounds} rounds; {shape}; store objects read unhashed: {unhashed}")
    medians, rows = {}, []
    for name, runs in results.items():
        medians[name] = statistics.median(s for s, _, _, _, _ in runs) * 1e3
        step = statistics.median(ms for _, _, ms, _, _ in runs)
        phases = {k: statistics.median(p.get(k, 0.0) for _, p, _, _, _ in runs) for k in runs[0][1]}
        shown = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        lora = {k: statistics.median(t[k] for _, _, _, t, _ in runs) for k in runs[0][3]}
        spent = f"{lora['lora']:.1f} (products {lora['products']:.1f})"
        chunks = runs[len(runs) // 2][4]  # one round's prompt chunks (rows per step)
        rows.append([KINDS[name], f"{medians[name]:.1f}", f"{step:.1f}", shown, spent, chunks])
    header = ["request", "first token ms (median)", "its step ms", "step phases (ms)"]
    print_table([*header, "LoRA ms", "chunks"], rows)
    print(f"warm / base {medians['warm'] / medians['base']:.2f} (goal <= 1.2); ", end="")
    print(f"cold / warm {medians['cold'] / medians['warm']:.2f} (goal <= 1.5); ", end="")
    print(f"store / cold {medians['store'] / medians['cold']:.2f}")


if __name__ == "__main__":
    main()

"""The engine's decode step on a GPU, with and without CUDA graphs (issue 63): its time,
where that time goes, and what bringing an adapter into a device slot adds.

64 sequences of 32-token prompts decode 64 tokens each, greedy, EOS ignored: base rows
only, then a mix over 16 rank-16 adapters on all seven projections. For each, the median
decode step (the engine's step records: wall time, and the host's phases) with CUDA graphs
and with `enforce_eager`. Then torch.profiler over 16 decode steps of each mixed arm: the
device's busy time (the union of its kernels' intervals) against the steps' wall time, and
the host ops and device kernels that take the most. Last, the slot copies: 16 slots, 32
adapters kept in the CPU tier; the same 16-adapter batch runs with its adapters resident
in the slots, and again after the other 16 took the slots, and the difference in the
steps' time over the 16 copies is what a slot copy adds to the steps that admit it.

    python3 benchmarks/gpu_step.py --model DIR_OR_GGUF     # on CUDA (gpu_check runs it)
    .venv/bin/python benchmarks/gpu_step.py --device cpu --num-seqs 4 --tokens 8  # wiring
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from harness import machine_line, print_table, random_adapters, spread_token_ids
from torch.profiler import ProfilerActivity, profile

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.model_loader import resolve_model

PROMPT_TOKENS = 32
PHASES = ("schedule", "prepare", "forward", "sample", "output")
PROFILED_STEPS = 16


def prompts(num: int, seed: int) -> list[dict]:
    return [{"prompt_token_ids": spread_token_ids(i, PROMPT_TOKENS, seed)} for i in range(num)]


def engine(args, eager: bool) -> LLM:
    """16 slots over the 32 adapters kept in the CPU tier (the slot copies' run swaps them)."""
    return LLM(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        enforce_eager=eager,
        max_num_seqs=args.num_seqs,
        max_model_len=256,
        enable_lora=True,
        max_loras=16,
        max_cpu_loras=32,
        max_lora_rank=16,
    )


def decode_records(llm: LLM, batch: list[dict], loras, tokens: int) -> list:
    """The step records of the decode steps of one `generate` over `batch`."""
    engine = llm.llm_engine
    first = len(engine.step_records)
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    outs = llm.generate(batch, params, lora_request=loras, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == tokens for o in outs)
    return [r for r in list(engine.step_records)[first:] if not r.prefill_tokens]


def step_row(label: str, records: list) -> list:
    phases = [statistics.median(dict(r.phases).get(p, 0.0) for r in records) for p in PHASES]
    return [label, f"{statistics.median(r.ms for r in records):.2f}"] + [f"{v:.2f}" for v in phases]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of the (start, end) intervals."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


def profiled(llm: LLM, batch: list[dict], loras, label: str) -> None:
    """torch.profiler over PROFILED_STEPS decode steps of the running batch."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=PROFILED_STEPS + 8, ignore_eos=True)
    for i, item in enumerate(batch):
        engine.add_request(f"{label}-{i}", item, params, loras[i] if loras else None)
    engine.step()
    while engine.step_records[-1].prefill_tokens:
        engine.step()
    engine.step()  # every row decoding from here
    cuda = engine.config.torch_device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    first = len(engine.step_records)
    with profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            engine.step()
    records = list(engine.step_records)[first:]
    while engine.has_unfinished_requests():
        engine.step()
    wall_ms = sum(r.ms for r in records)
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    busy_ms = union_us([(e.time_range.start, e.time_range.end) for e in kernels]) / 1e3
    print(
        f"\n### {label}: {PROFILED_STEPS} decode steps, {wall_ms / PROFILED_STEPS:.2f} ms a step, "
        f"device busy {busy_ms / PROFILED_STEPS:.2f} ms a step "
        f"({busy_ms / wall_ms:.0%} of the wall time), {len(kernels) / PROFILED_STEPS:.0f} "
        "kernels a step",
        flush=True,
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    if cuda:
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF dir or GGUF file (default: SmolLM2-135M)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-cache-memory-gb", type=float, default=None)
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens a sequence")
    ap.add_argument("--adapters-dir", type=Path, default=None)
    args = ap.parse_args()
    source = resolve_model(args.model)
    root = args.adapters_dir or Path(tempfile.mkdtemp(prefix="gpu-step-"))
    paths = random_adapters(root, 32, rank=16, source=source)
    loras = [LoRARequest(f"a{i:03d}", i + 1, str(p)) for i, p in enumerate(paths)]
    batch = prompts(args.num_seqs, 0)
    mixed = [loras[i % 16] for i in range(args.num_seqs)]
    print(machine_line(torch.device(args.device)))
    print(f"# {source.name}, {args.dtype}, {args.num_seqs} sequences x {args.tokens} tokens")
    rows = []
    for eager in (False, True):
        mode = "eager" if eager else "CUDA graphs"
        llm = engine(args, eager)
        decode_records(llm, batch[:4], mixed[:4], 4)  # warm-up: graphs, adapters loaded
        rows.append(step_row(f"base rows, {mode}", decode_records(llm, batch, None, args.tokens)))
        mixed_records = decode_records(llm, batch, mixed, args.tokens)
        rows.append(step_row(f"16 adapters, {mode}", mixed_records))
        profiled(llm, batch, mixed, f"16 adapters, {mode}")
        del llm
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print("\n## Decode step, median ms (host phases: what the host spent in each)\n")
    print_table(["batch", "step ms", *PHASES], rows)

    llm = engine(args, eager=False)
    first, second = loras[:16], loras[16:]
    picks = [first[i % 16] for i in range(args.num_seqs)]
    decode_records(llm, batch, picks, 4)  # the first 16 in the slots
    decode_records(llm, batch, [second[i % 16] for i in range(args.num_seqs)], 4)
    core = llm.llm_engine
    start = len(core.step_records)
    decode_records(llm, batch, picks, args.tokens)
    cold = list(core.step_records)[start:]
    start = len(core.step_records)
    decode_records(llm, batch, picks, args.tokens)
    warm = list(core.step_records)[start:]
    spent = {
        name: sum(r.ms + r.load_window_ms for r in records)
        for name, records in (("cold", cold), ("warm", warm))
    }
    print("\n## Slot copies: the same batch, its 16 adapters copied into the slots or not\n")
    print_table(
        ["run", "steps", "step ms, total", "per adapter copied"],
        [
            ["16 slots to fill (CPU tier warm)", len(cold), f"{spent['cold']:.1f}", "-"],
            ["16 adapters resident", len(warm), f"{spent['warm']:.1f}", "-"],
            [
                "difference",
                "",
                f"{spent['cold'] - spent['warm']:.1f}",
                f"{(spent['cold'] - spent['warm']) / 16:.2f} ms",
            ],
        ],
    )
    resident = [r for r in warm if not r.prefill_tokens]
    print(f"# resident decode step median {statistics.median(r.ms for r in resident):.2f} ms")


if __name__ == "__main__":
    main()

"""Multi-LoRA throughput: the engine against PEFT mixed-adapter batches, in one run.

Short chat requests (offline_workloads.py's word_workload) spread over rank-8 adapters on
all 7 projections with power-law popularity (S-LoRA's trace: adapter = floor(power(alpha) *
n), alpha 0.3), the adapters kept under benchmarks/results/adapters. Compared:
PEFT static batches of 16 with `generate(..., adapter_names=...)`, the engine serving the
base model only, and the engine with 1, 16, 64 and 256 distinct adapters.

    .venv/bin/python benchmarks/multi_lora.py --num-requests 256   # ~30 min on 2 cores

Besides the table it writes benchmarks/results/multi_lora.png (matplotlib, the `bench`
extra): throughput against the number of distinct adapters, with the base-model-only and
PEFT runs as references.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from harness import (
    RESULTS,
    add_engine_args,
    engine_options,
    generate_seconds,
    kept_adapters,
    load_average,
    machine_line,
    print_table,
    static_batch_seconds,
)
from offline_workloads import power_law_choice, word_workload
from peft import PeftModel
from plots import plot_throughput_vs_adapters
from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.engine import LLM
from loragate.engine.loading.model_loader import resolve_model


def run_engine(llm, prompts, lengths, loras) -> float:
    """Output tokens per second of `llm.generate` on the workload."""
    return sum(lengths) / generate_seconds(llm, prompts, lengths, loras)


def run_peft(hf_dir, paths, prompts, lengths, names, batch: int, device, dtype) -> float:
    """PEFT's mixed-adapter static batches: output tokens per second."""
    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype).to(device).eval()
    model = PeftModel.from_pretrained(base, paths[0], adapter_name="a0")
    for i, p in enumerate(paths[1:], start=1):
        model.load_adapter(p, adapter_name=f"a{i}")
    return sum(lengths) / static_batch_seconds(model, prompts, lengths, batch, 2, names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(ap)
    ap.add_argument("--adapters", type=int, default=16)
    ap.add_argument(
        "--max-output-len", type=int, default=128, help="output lengths: uniform in min(32, N)..N"
    )
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--sweep", default="1,16,64,256", help="distinct adapter counts to sweep")
    ap.add_argument("--skip-peft", action="store_true")
    ap.add_argument("--plot", default=str(RESULTS / "multi_lora.png"), help="PNG path")
    args = ap.parse_args()

    source = resolve_model(args.model)
    sweep = [int(x) for x in args.sweep.split(",") if x]
    paths = kept_adapters(source, max([args.adapters, *sweep]))
    rng = random.Random(args.seed)

    def engine_for(distinct: int) -> LLM:
        return LLM(
            **engine_options(args),
            enable_lora=True,
            max_loras=min(distinct, args.max_num_seqs),
            max_lora_rank=8,
            max_cpu_loras=max(64, distinct),
        )

    llm = engine_for(args.adapters)
    device, dtype = llm.engine.config.torch_device, llm.engine.config.torch_dtype
    prompts, lengths = word_workload(llm, args.num_requests, args.seed, args.max_output_len)
    choice = [power_law_choice(rng, args.adapters, args.alpha) for _ in prompts]
    loras = [LoRARequest(f"r8-{i:03d}", i + 1, str(paths[i])) for i in range(len(paths))]
    print(machine_line(device))
    print(
        f"# requests {len(prompts)}, output tokens {sum(lengths)}, max_num_seqs "
        f"{args.max_num_seqs}, {len(set(choice))} of {args.adapters} adapters drawn; "
        f"{source.name} on {device} in {str(dtype).split('.')[-1]}",
        flush=True,
    )
    rows: list[tuple[str, float]] = []

    def record(label: str, tps: float) -> None:
        rows.append((label, tps))
        print(f"{label}: {tps:.1f} tok/s", flush=True)

    run_engine(llm, prompts[:4], [8] * 4, [loras[0]] * 4)  # warm-up
    record("engine, base model only", run_engine(llm, prompts, lengths, None))
    record(
        f"engine, {args.adapters} adapters (power law {args.alpha})",
        run_engine(llm, prompts, lengths, [loras[c] for c in choice]),
    )
    del llm
    swept: list[tuple[int, float]] = []
    for distinct in sweep:
        llm = engine_for(distinct)
        picks = [loras[i % distinct] for i in range(len(prompts))]
        run_engine(llm, prompts[:4], [8] * 4, picks[:4])
        tps = run_engine(llm, prompts, lengths, picks)
        used = len({p.lora_int_id for p in picks})
        slots = min(distinct, args.max_num_seqs)
        record(f"engine, {used} distinct adapters (round robin, max_loras {slots})", tps)
        swept.append((used, tps))
        del llm
    peft_tps = None
    if not args.skip_peft:
        names = [f"a{c}" for c in choice]
        peft_tps = run_peft(
            source.hf_dir, paths[: args.adapters], prompts, lengths, names, 16, device, dtype
        )
        record("PEFT, mixed-adapter static batch 16", peft_tps)

    base_tps = rows[0][1]
    table = [
        [
            label,
            f"{tps:.1f}",
            f"{tps / peft_tps:.2f}x" if peft_tps else "-",
            f"{tps / base_tps:.0%}",
        ]
        for label, tps in rows
    ]
    print_table(["system", "tokens/s", "vs PEFT", "vs base-only"], table)
    print(f"# load average at end {load_average():.2f}")
    references = {"engine, base model only": base_tps}
    if peft_tps:
        references["PEFT, mixed-adapter static batch 16"] = peft_tps
    note = (
        f"{source.name} on {device} in {str(dtype).split('.')[-1]}, {len(prompts)} requests\n"
        + machine_line(device).removeprefix("# ")  # the load average at the end
    )
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    plot_throughput_vs_adapters(swept, references, Path(args.plot), note)
    print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()

"""A thousand rank-8 adapters of the default model resident at once, served in mixed batches.

Issue 47's "many adapters resident" on a CPU, where the device slots borrow the CPU tier's
rows (adapters/slots.py): 1000 rank-8 adapters on all seven projections of SmolLM2-135M in
bfloat16 (4.9 MB each, about 5 GB), every one in a slot at once.

The adapters are real PEFT files written directly: PEFT saves one adapter of the same shape
first (tools/random_adapter.py) and its adapter_config.json, key names and shapes are the
template every other adapter follows; the weights are seeded and drawn as that helper draws
them (``init_scale`` 0.1: each projection's change about a tenth of its input), in bfloat16.

The run, one engine (``max_loras`` = ``max_cpu_loras`` = the adapter count, given: the
default is sized from memory, engine/lora/lora_capacity.py, and is printed beside it):
1. cold pass: rounds of ``--batch`` prompts, each on a different adapter, until every
   adapter has served (each read from disk once);
2. warm pass, round by round: the same LoRA batch again (all resident: no disk read), then
   the same prompts on the base alone; tokens/s of both, LoRA's cost (W2 against W1 style);
3. a check: for ``--check`` adapters, the engine's bfloat16 greedy tokens are top-5 close to
   PEFT's float32 teacher-forced on them (as tests/engine/test_cpu_bfloat16.py checks).

Reported: process RSS before and after, adapter bytes resident, load time per adapter,
tokens/s, step-time percentiles, the most adapters in one step; JSON under
benchmarks/results/.

    .venv/bin/python benchmarks/thousand_adapters.py --count 1000 --batch 128
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from harness import cpu_name
from safetensors import safe_open
from safetensors.torch import save_file

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.model_loader import resolve_model
from loragate.engine.lora.lora_capacity import available_memory, lora_capacity

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 8
INIT_SCALE = 0.1
RESULTS = Path(__file__).parent / "results"
SUBJECTS = [
    "the sea",
    "a lighthouse",
    "mountains",
    "a city at night",
    "rain",
    "an old library",
    "the moon",
    "a forest",
]
ASKS = [
    "Write one sentence about {}.",
    "Name three words that describe {}.",
    "What colour do you think of for {}?",
    "Give a short title for a story about {}.",
]


# ---- the adapters --------------------------------------------------------------------------
def peft_template(root: Path) -> tuple[dict, dict[str, list[int]]]:
    """One rank-8 adapter saved by PEFT itself: its config and its tensors' names and shapes."""
    from transformers import AutoModelForCausalLM

    from loragate.tools import make_random_adapter

    base = AutoModelForCausalLM.from_pretrained(resolve_model(None).hf_dir)
    path = make_random_adapter(base, root / "peft-saved", rank=RANK, targets=TARGETS, seed=0)
    config = json.loads((path / "adapter_config.json").read_text())
    with safe_open(path / "adapter_model.safetensors", "pt") as f:
        shapes = {key: list(f.get_slice(key).get_shape()) for key in f.keys()}
    shutil.rmtree(path)
    return config, shapes


def write_adapter(out: Path, config: dict, shapes: dict[str, list[int]], seed: int) -> Path:
    """A PEFT directory with ``config`` and seeded bfloat16 tensors of ``shapes``, drawn as
    tools/random_adapter.py draws them: A ~ N(0, 1/d_in), B ~ N(0, (init_scale / (scaling
    * sqrt(r)))^2)."""
    generator = torch.Generator().manual_seed(seed)
    scaling = config["lora_alpha"] / config["r"]
    tensors = {}
    for key in sorted(shapes):
        rows, cols = shapes[key]
        weight = torch.randn(rows, cols, generator=generator)
        if ".lora_A." in key:
            weight /= math.sqrt(cols)
        else:
            weight *= INIT_SCALE / (abs(scaling) * math.sqrt(cols))
        tensors[key] = weight.to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    return out


def write_adapters(root: Path, count: int) -> list[Path]:
    config, shapes = peft_template(root)
    return [write_adapter(root / f"a{i:04d}", config, shapes, seed=i) for i in range(count)]


# ---- measuring -----------------------------------------------------------------------------
def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def count_slots(engine) -> list[int]:
    """Wrap the scheduler so each step's number of distinct adapters is logged."""
    widths: list[int] = []
    schedule = engine.scheduler.schedule

    def logged():
        out = schedule()
        slots = {s.seq.lora_slot for s in out.prefills + out.decodes}
        widths.append(len(slots - {-1, None}))
        return out

    engine.scheduler.schedule = logged
    return widths


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": ordered[-1]}


class Run:
    """One generate call over token-id prompts, timed, with the step records it ran."""

    def __init__(self, llm: LLM, prompts, params, loras):
        engine = llm.llm_engine
        before = engine.step_records[-1].index if engine.step_records else -1
        start = time.perf_counter()
        self.outputs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts],
            params,
            lora_request=loras,
            use_tqdm=False,
        )
        self.seconds = time.perf_counter() - start
        self.tokens = sum(len(o.outputs[0].token_ids) for o in self.outputs)
        self.steps = [r for r in engine.step_records if r.index > before]


# ---- the check against PEFT float32 ----------------------------------------------------------
def check_against_peft(llm: LLM, paths, loras, prompts, names: list[int], n: int) -> dict:
    """Greedy tokens of ``names`` in bf16 against PEFT float32 teacher-forced on them: the
    engine's token in PEFT's top 5 and PEFT's top token in the engine's top 5, every step."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model(None).hf_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base.eval(), str(paths[names[0]]), adapter_name="a0")
    for j, i in enumerate(names[1:], 1):
        model.load_adapter(str(paths[i]), adapter_name=f"a{j}")
    model.eval()
    rows = []
    for j in range(len(names)):
        rows += [(None, prompts[j % len(prompts)]), (j, prompts[j % len(prompts)])]
    params = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, logprobs=5)
    outs = llm.generate(
        [{"prompt_token_ids": p} for _, p in rows],
        params,
        lora_request=[None if j is None else loras[names[j]] for j, _ in rows],
        use_tqdm=False,
    )
    steps = close = changed = 0
    base_tokens = None
    for (j, prompt), out in zip(rows, outs, strict=True):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        with torch.inference_mode():
            ids = torch.tensor([prompt + list(tokens)])
            if j is None:
                with model.disable_adapter():
                    logits = model(input_ids=ids).logits[0].float()
            else:
                model.set_adapter(f"a{j}")
                logits = model(input_ids=ids).logits[0].float()
        top5 = logits[len(prompt) - 1 : -1].topk(5, dim=-1).indices.tolist()
        for token, engine_top, ref in zip(tokens, logprobs, top5, strict=True):
            engine5 = sorted(engine_top, key=engine_top.get, reverse=True)[:5]
            steps += 1
            close += token in ref and ref[0] in engine5
        if j is None:
            base_tokens = list(tokens)  # the base on the prompt of the adapter after it
        else:
            changed += list(tokens) != base_tokens
    return {
        "adapters": len(names),
        "tokens_each": n,
        "steps": steps,
        "top5_close": close,
        "adapter_outputs_unlike_base": changed,
    }


# ---- the run -------------------------------------------------------------------------------
def prompts_for(llm: LLM, count: int) -> list[list[int]]:
    """``count`` distinct chat prompts as token ids."""
    out = []
    for i in range(count):
        ask = ASKS[i % len(ASKS)].format(SUBJECTS[(i // len(ASKS)) % len(SUBJECTS)])
        text = f"{ask} (#{i})"
        out.append(llm.apply_chat_template([{"role": "user", "content": text}]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000, help="adapters")
    ap.add_argument("--batch", type=int, default=128, help="prompts per round, each its own")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--check", type=int, default=10, help="adapters checked against PEFT")
    ap.add_argument("--out", type=Path, default=None, help="where the adapters go")
    ap.add_argument("--keep", action="store_true", help="keep the adapters' files")
    args = ap.parse_args()

    # A kill (SIGTERM) still runs the cleanup below: 5 GB of adapters left in /tmp otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = args.out or Path(tempfile.mkdtemp(prefix="thousand-adapters-"))
    root.mkdir(parents=True, exist_ok=True)
    record: dict = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "node": os.uname().nodename},
        "args": {k: str(v) for k, v in vars(args).items()},
        "load_average_start": load_average(),
    }
    try:
        start = time.perf_counter()
        paths = write_adapters(root, args.count)
        record["write_seconds"] = time.perf_counter() - start
        record["adapter_file_bytes"] = sum(
            (p / "adapter_model.safetensors").stat().st_size for p in paths
        )
        print(
            f"wrote {args.count} adapters ({record['adapter_file_bytes'] / 1e9:.2f} GB) "
            f"in {record['write_seconds']:.0f} s under {root}",
            flush=True,
        )
        record.update(serve(args, paths))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    record["load_average_end"] = load_average()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"thousand_adapters_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(record, indent=2))
    report(record)
    print(f"# JSON: {out}")


def serve(args, paths: list[Path]) -> dict:
    record: dict = {"rss_before_engine": rss_bytes()}
    llm = LLM(
        dtype="bfloat16",
        max_model_len=512,
        max_num_seqs=args.batch,
        kv_cache_memory_gb=0.5,
        enable_lora=True,
        max_lora_rank=RANK,
        max_loras=args.count,
        max_cpu_loras=args.count,
    )
    engine = llm.llm_engine
    residency = engine.residency
    # What the engine would have chosen with max_loras / max_cpu_loras left unset.
    spec = engine.model.lora_spec(engine.base_model_name)
    unset = replace(engine.config, max_loras=None, max_cpu_loras=None)
    default = lora_capacity(unset, spec, torch.device("cpu"), torch.bfloat16, available_memory())
    record["default_capacity"] = default.describe()
    record["rss_engine"] = rss_bytes()
    widths = count_slots(engine)
    loras = [LoRARequest(f"a{i:04d}", i + 1, str(p)) for i, p in enumerate(paths)]
    prompts = prompts_for(llm, args.batch)
    params = SamplingParams(
        temperature=0, max_tokens=args.tokens, min_tokens=args.tokens, ignore_eos=True
    )
    rounds = math.ceil(args.count / args.batch)
    batches = [
        [loras[(r * args.batch + k) % args.count] for k in range(args.batch)] for r in range(rounds)
    ]

    cold = []
    for r, batch in enumerate(batches):
        run = Run(llm, prompts, params, batch)
        cold.append(run)
        print(
            f"cold round {r}: {run.tokens / run.seconds:.1f} tok/s, {len(run.steps)} steps "
            f"({sum(s.ms for s in run.steps) / 1e3:.1f} of its {run.seconds:.1f} s), "
            f"RSS {rss_bytes() / 2**30:.2f} GiB, {residency.counts()['resident_adapters']} "
            f"resident",
            flush=True,
        )
    after_cold = residency.counts()
    record["rss_after_cold"] = rss_bytes()
    record["cold"] = {
        "seconds": sum(r.seconds for r in cold),
        "tokens": sum(r.tokens for r in cold),
        "steps": sum(len(r.steps) for r in cold),
        "counts": after_cold,
        "load_seconds_per_adapter": after_cold["load_seconds"] / max(1, after_cold["disk_loads"]),
    }
    record["widest_step_cold"] = max(widths, default=0)

    widths.clear()
    warm, base = [], []
    for r, batch in enumerate(batches):
        warm.append(Run(llm, prompts, params, batch))
        base.append(Run(llm, prompts, params, None))
        print(
            f"warm round {r}: LoRA {warm[-1].tokens / warm[-1].seconds:.1f} tok/s, "
            f"base {base[-1].tokens / base[-1].seconds:.1f} tok/s",
            flush=True,
        )
    after_warm = residency.counts()
    record["rss_after_warm"] = rss_bytes()
    record["widest_step_warm"] = max(widths, default=0)
    for name, runs in (("warm", warm), ("base", base)):
        steps = [s for run in runs for s in run.steps]
        record[name] = {
            "seconds": sum(r.seconds for r in runs),
            "tokens": sum(r.tokens for r in runs),
            "tok_s": sum(r.tokens for r in runs) / sum(r.seconds for r in runs),
            "tok_s_rounds": [r.tokens / r.seconds for r in runs],
            "steps": len(steps),
            "step_ms": percentiles([s.ms for s in steps]),
            "decode_step_ms": percentiles([s.ms for s in steps if s.prefill_tokens == 0]),
        }
    record["warm"]["counts"] = after_warm
    record["warm"]["new_disk_loads"] = after_warm["disk_loads"] - after_cold["disk_loads"]
    record["warm"]["new_slot_loads"] = after_warm["slot_loads"] - after_cold["slot_loads"]
    record["lora_cost"] = 1 - record["warm"]["tok_s"] / record["base"]["tok_s"]
    same = sum(
        a.outputs[0].token_ids == b.outputs[0].token_ids
        for c, w in zip(cold, warm, strict=True)
        for a, b in zip(c.outputs, w.outputs, strict=True)
    )
    record["warm_equals_cold_outputs"] = f"{same}/{sum(len(w.outputs) for w in warm)}"

    if args.check:
        sample = torch.randperm(args.count, generator=torch.Generator().manual_seed(1))
        names = sorted(int(i) for i in sample[: args.check])
        record["check"] = check_against_peft(llm, paths, loras, prompts, names, 16)
        record["check"]["sampled"] = names
    final = residency.counts()
    record["final_counts"] = final
    record["rss_end"] = rss_bytes()
    return record


def report(record: dict) -> None:
    cold, warm, base = record["cold"], record["warm"], record["base"]
    counts = warm["counts"]
    print(f"# {record['machine']['cpu']}, {record['machine']['cores']} cores")
    print(f"# load average at start {record['load_average_start']}")
    print(f"# load average at end {record['load_average_end']}")
    print(f"# default with max_loras/max_cpu_loras unset: {record['default_capacity']}")
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows(record, cold, warm, base, counts):
        print(f"| {name} | {value} |")


def rows(record: dict, cold: dict, warm: dict, base: dict, counts: dict) -> list[tuple]:
    gib = 2**30
    rss = "/".join(
        f"{record[k] / gib:.2f}"
        for k in ("rss_before_engine", "rss_engine", "rss_after_cold", "rss_after_warm", "rss_end")
    )
    per_load = cold["load_seconds_per_adapter"] * 1e3
    cold_rate = cold["tokens"] / cold["seconds"]
    out = [
        (
            "adapters in slots / CPU tier",
            f"{counts['resident_adapters']} / {counts['cpu_adapters']}",
        ),
        (
            "adapter bytes in slots / CPU tier",
            f"{counts['resident_bytes'] / gib:.2f} / {counts['cpu_bytes'] / gib:.2f} GiB",
        ),
        ("adapter files on disk", f"{record['adapter_file_bytes'] / 1e9:.2f} GB"),
        ("RSS GiB: start / engine / after cold / after warm / end", rss),
        ("disk loads in the cold pass", f"{cold['counts']['disk_loads']} ({per_load:.1f} ms each)"),
        (
            "cold pass",
            f"{cold['tokens']} tokens, {cold['seconds']:.1f} s, {cold_rate:.1f} tok/s, "
            f"{cold['steps']} steps",
        ),
        (
            "warm pass: new disk loads / slot loads",
            f"{warm['new_disk_loads']} / {warm['new_slot_loads']}",
        ),
        ("warm LoRA tok/s (rounds)", f"{warm['tok_s']:.1f} ({_rounds(warm)})"),
        ("base tok/s (rounds)", f"{base['tok_s']:.1f} ({_rounds(base)})"),
        ("LoRA's cost", f"{record['lora_cost']:.0%}"),
        ("step ms LoRA p50/p90/p99/max", _ms(warm["step_ms"])),
        ("step ms base p50/p90/p99/max", _ms(base["step_ms"])),
        ("decode step ms LoRA p50/p90/p99/max", _ms(warm["decode_step_ms"])),
        ("decode step ms base p50/p90/p99/max", _ms(base["decode_step_ms"])),
        (
            "most adapters in one step, cold / warm",
            f"{record['widest_step_cold']} / {record['widest_step_warm']}",
        ),
        ("warm outputs equal to cold's", record["warm_equals_cold_outputs"]),
    ]
    if "check" in record:
        c = record["check"]
        out.append(
            (
                "bf16 top-5 close to PEFT float32",
                f"{c['top5_close']}/{c['steps']} steps, {c['adapters']} adapters and the base; "
                f"{c['adapter_outputs_unlike_base']} adapters' tokens unlike the base's",
            )
        )
    return out


def _rounds(part: dict) -> str:
    return ", ".join(f"{x:.0f}" for x in part["tok_s_rounds"])


def _ms(values: dict) -> str:
    return "/".join(f"{v:.0f}" for v in values.values())


if __name__ == "__main__":
    main()

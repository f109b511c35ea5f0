"""Measure what the fleet model needs from one replica on this machine, and write it to
benchmarks/fleet_figures.json: step time against prompt tokens, running sequences and
distinct adapters in the batch (least squares on the engine's own step records), and the
adapter load times disk -> CPU tier and CPU tier -> slot. One engine, one torch thread (what
a replica of `--replica-cpus 0.5` or 1 gets from Ray), the replica benchmark's settings:
rank-8 adapters on q/k/v/o, 4 slots, 8 in the CPU tier, 32-token prompts, 16 tokens out.

A disk load is timed twice: alone (nothing running: no pauses), and paced, as the check
run's replicas load, while the engine steps on another thread and `--other-steppers`
processes keep the other cores busy the way the other replicas' step threads do (one torch
thread each, multiplying matrices): its work then waits for a core and for the GIL, and
its pauses are a multiple of that wall time (adapters/pacing.py).

The adapter store's fetch is not measured here: it is taken from BENCHMARKS.md (issue 37,
quiet machine: a cold adapter from S3 costs 88 ms more to its first token than one in the
CPU tier, 20 MB over localhost). The ingress-to-replica overhead is measured by
benchmarks/fleet/check_run.py against a deployed replica.

    cd benchmarks && ../.venv/bin/python -m fleet.measure
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from harness import random_adapters

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.tools.base_model import resolve_base_model

from .figures import FIGURES_JSON, Capacity, Figures, LoadTimes, StepTime

STORE_MS_FROM_BENCHMARKS = 88.0  # 0.274 s cold - 0.186 s in the CPU tier, issue 37's table
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def machine() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if "Model name" in line]
    return f"{names[0] if names else platform.processor()}, {torch.get_num_threads()} torch thread"


def fit_non_negative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: a cost that the noise of a loaded machine
    fits below zero (a distinct adapter's, beside the model's) is taken as none."""
    keep = list(range(x.shape[1]))
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep] = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (coef >= 0).all():
            return coef
        keep.remove(int(np.argmin(coef)))


def loads_beside_steps(
    load: Callable[[int], None],
    steps: Callable[[threading.Event], None],
    running: Callable[[], bool],
    count: int,
    settle_s: float = 1.0,
) -> list[float]:
    """Milliseconds of `count` loads (`load(i)` on this thread) while `steps(stop)` runs on a
    thread of its own until `stop` is set. Each load starts once `running()` (sequences are
    running, so the load is paced) and counts only if they still run when it ends; one that
    ended beside none is tried again with the next index. `settle_s` lets the steps reach
    their pace first."""
    stop = threading.Event()
    stepper = threading.Thread(target=steps, args=(stop,), daemon=True)
    stepper.start()
    out: list[float] = []
    try:
        time.sleep(settle_s)
        i = 0
        while len(out) < count:
            while not running():
                if not stepper.is_alive():
                    raise RuntimeError("the steps ended before the loads were timed")
                time.sleep(0.005)
            began = time.perf_counter()
            load(i)
            ms = (time.perf_counter() - began) * 1e3
            if running():
                out.append(ms)
            i += 1
    finally:
        stop.set()
        stepper.join()
    return out


def spin(stop) -> None:
    """Another replica's step thread, for the cores it takes: one torch thread multiplying
    matrices until `stop` (a multiprocessing Event) is set."""
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        for _ in range(20):
            a = torch.tanh(a @ a)


def other_steppers(n: int) -> tuple[list, object]:
    """`n` processes running `spin`, and the event that stops them."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=spin, args=(stop,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    return procs, stop


def paced_load_ms(llm, loras: list, count: int, input_len: int, others: int) -> list[float]:
    """Milliseconds of `count` loads from disk into the CPU tier (the engine's own load, off
    the step thread, as a replica's loader runs it) while the engine decodes 8 sequences on
    another thread and `others` processes keep the other cores busy. `loras`: fresh ones,
    twice `count` (a load that ended beside no running sequence is tried with the next)."""
    engine = llm.llm_engine
    rng = np.random.default_rng(1)
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)

    def steps(stop: threading.Event) -> None:
        torch.set_num_threads(1)  # a replica's one torch thread, on the thread that steps
        while not stop.is_set():
            prompts = [
                {"prompt_token_ids": rng.integers(100, 40000, input_len).tolist()} for _ in range(8)
            ]
            llm.generate(prompts, params, use_tqdm=False)

    procs, stop = other_steppers(others)
    try:
        return loads_beside_steps(
            lambda i: engine.add_adapter(loras[i]),
            steps,
            lambda: bool(engine.scheduler.running),
            count=count,
        )
    finally:
        stop.set()
        for proc in procs:
            proc.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--adapters", default="0,1,2,4")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=FIGURES_JSON)
    p.add_argument(
        "--other-steppers",
        type=int,
        default=1,
        help="processes busy beside the paced loads: the check run's other replicas",
    )
    p.add_argument("--paced-loads", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    cap = Capacity(slots=4, cpu_tier=8, max_num_seqs=64, token_budget=512)
    source = resolve_base_model(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        paths = random_adapters(
            Path(tmp), 12 + 2 * args.paced_loads, rank=8, targets=TARGETS, source=source
        )
        loras = [LoRARequest(f"a{i}", i + 1, str(path)) for i, path in enumerate(paths)]
        llm = LLM(**cap.engine_options(args.model))
        engine = llm.llm_engine
        disk = []
        for lora in loras[4:12]:  # fresh adapters, read from disk into the CPU tier
            t = time.perf_counter()
            engine.add_adapter(lora)
            disk.append((time.perf_counter() - t) * 1e3)
        paced = paced_load_ms(
            llm, loras[12:], args.paced_loads, args.input_len, args.other_steppers
        )
        params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
        rng = np.random.default_rng(0)
        rows, ms = [], []
        for round_ in range(args.repeats + 1):  # the first round warms up and is dropped
            first = round_ == 0
            for b in map(int, args.batches.split(",")):
                for d in map(int, args.adapters.split(",")):
                    start = len(engine.step_records) and engine.step_records[-1].index
                    prompts = [
                        {"prompt_token_ids": rng.integers(100, 40000, args.input_len).tolist()}
                        for _ in range(b)
                    ]
                    picks = [loras[i % d] if d else None for i in range(b)]
                    llm.generate(prompts, params, lora_request=picks, use_tqdm=False)
                    if first:
                        continue
                    for rec in engine.step_records:
                        if rec.index > start:
                            rows.append((rec.prefill_tokens, len(rec.decode_seq_ids), min(d, b)))
                            ms.append(rec.ms)
        x = np.array([[1.0, *r] for r in rows])
        coef = fit_non_negative(x, np.array(ms))
        fit = x @ coef
        err = float(np.median(np.abs(fit - ms) / np.array(ms)))
        slot = [row[3] / row[2] * 1e3 for row in engine.residency.loads().values() if row[2]]
    figures = Figures(
        step=StepTime(*(round(float(c), 4) for c in coef)),
        load=LoadTimes(
            store_ms=STORE_MS_FROM_BENCHMARKS,
            disk_ms=round(statistics.median(disk), 2),
            slot_ms=round(statistics.median(slot), 3) if slot else 0.0,
            disk_paced_ms=round(statistics.median(paced), 2),
            disk_paced_samples_ms=tuple(round(v, 1) for v in paced),
        ),
        capacity=cap,
        source={
            "machine": machine(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "cd benchmarks && ../.venv/bin/python -m fleet.measure",
            "load_average": " ".join(f"{v:.2f}" for v in __import__("os").getloadavg()),
            "model": source.name,
            "steps_fitted": len(ms),
            "fit_median_relative_error": round(err, 3),
            "disk_ms_samples": [round(v, 1) for v in disk],
            "disk_paced_beside": f"the engine stepping 8 sequences, {args.other_steppers} "
            "other stepping processes",
            "measured": "step time (fit), disk_ms, disk_paced_ms, slot_ms",
            "from_benchmarks_md": "store_ms (issue 37, quiet machine)",
            "from_check_run": "overhead_ms (benchmarks/fleet/check_run.py)",
        },
    )
    steps = Path("results/fleet_steps.json")  # the raw step records, beside the fit
    steps.parent.mkdir(parents=True, exist_ok=True)
    steps.write_text(
        json.dumps(
            {
                "columns": ["prefill_tokens", "decode_seqs", "adapters", "ms"],
                "rows": [[*r, m] for r, m in zip(rows, ms, strict=True)],
            }
        )
    )
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    record = figures.to_json() | {"overhead_ms": old.get("overhead_ms", 0.0)}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()

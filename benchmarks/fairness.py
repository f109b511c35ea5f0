"""Fair share under a flood (issues 17 and 60): 4 tenants, each on its own rank-8 adapter,
one of them sending at 10x the others' rate. Reports the quiet tenants' TTFT (p50, p99) and
the total throughput under `fcfs` and `fair`, on the same arrivals, and the quiet tenants'
TTFT alone (the flood left out, `--alone`), and plots the TTFT distributions and each
tenant's share of the service over time. Each tenant sends at a steady rate from a random
(seeded) phase, so every run has the same number of quiet requests however short.

    .venv/bin/python benchmarks/fairness.py --duration 60 --quiet-rate 0.05 \
        --plot docs/benchmarks/fairness.png

The engine runs in this process, stepped in a loop; each request is added at its arrival
time (between steps) and its TTFT runs from that arrival time to its first token.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loragate.adapters import LoRARequest
from loragate.engine import EngineConfig, LLMEngine, SamplingParams
from loragate.engine.loading.model_loader import load_config, resolve_model

TENANTS = ("flood", "quiet-1", "quiet-2", "quiet-3")


@dataclass
class Arrival:
    at: float  # seconds after the start
    tenant: str
    prompt: list[int]


@dataclass
class Result:
    tenant: str
    ttft: float
    finished_at: float
    output_tokens: int


def workload(args, vocab_size: int) -> list[Arrival]:
    rng = random.Random(args.seed)
    arrivals = []
    for tenant in TENANTS:
        rate = args.quiet_rate * (args.flood_factor if tenant == "flood" else 1)
        at = rng.uniform(0, 1 / rate)
        while at < args.duration:
            length = max(4, int(args.input_len * rng.uniform(0.75, 1.25)))
            prompt = [rng.randrange(300, vocab_size) for _ in range(length)]
            arrivals.append(Arrival(at, tenant, prompt))
            at += 1 / rate
    return sorted(arrivals, key=lambda a: a.at)


def adapters_for(source) -> dict[str, LoRARequest]:
    from harness import kept_adapters  # the benchmarks' shared random adapters

    paths = kept_adapters(source, len(TENANTS))
    pairs = enumerate(zip(TENANTS, paths, strict=True))
    return {tenant: LoRARequest(tenant, i + 1, str(path)) for i, (tenant, path) in pairs}


def run(args, policy: str, arrivals: list[Arrival], loras) -> tuple[list[Result], dict, list]:
    config = EngineConfig(
        model=args.model,
        enable_lora=True,
        max_loras=len(TENANTS),
        max_lora_rank=8,
        max_num_seqs=args.max_num_seqs,
        max_model_len=1024,
        kv_cache_memory_gb=0.5,
        scheduling_policy=policy,
    )
    engine = LLMEngine(config)
    params = SamplingParams(
        temperature=0, max_tokens=args.output_len, min_tokens=args.output_len, ignore_eos=True
    )
    for tenant, lora in loras.items():  # warm-up: every adapter in a slot
        engine.add_request(f"warm-{tenant}", {"prompt_token_ids": [1, 2, 3]}, params, lora)
    while engine.has_unfinished_requests():
        engine.step()
    warm_steps = len(engine.step_records)
    pending = list(arrivals)
    live = {}
    results = []
    shares = []  # (seconds since the start, {tenant: weighted tokens served so far})
    served_before = dict(engine.fair_share.served)
    start = time.monotonic()
    while pending or engine.has_unfinished_requests():
        now = time.monotonic() - start
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            request_id = f"{a.tenant}-{len(live) + len(results)}"
            engine.add_request(
                request_id,
                {"prompt_token_ids": a.prompt},
                params,
                loras[a.tenant],
                tenant=a.tenant,
            )
            live[request_id] = a
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(0.05, pending[0].at - now)))
            continue
        requests = {rid: engine.requests[rid] for rid in live}
        outs = engine.step()
        served = {t: v - served_before.get(t, 0.0) for t, v in engine.fair_share.served.items()}
        shares.append((time.monotonic() - start, {t: served.get(t, 0.0) for t in TENANTS}))
        for out in outs:
            if out.finished:
                a = live.pop(out.request_id)
                first = requests[out.request_id].first_token_time
                results.append(
                    Result(
                        tenant=a.tenant,
                        ttft=first - start - a.at,
                        finished_at=time.monotonic() - start,
                        output_tokens=len(out.outputs[0].token_ids),
                    )
                )
    makespan = max(r.finished_at for r in results) - arrivals[0].at
    busy_s = sum(r.ms for r in list(engine.step_records)[warm_steps:]) / 1e3
    tokens = sum(r.output_tokens for r in results)
    preempted = dict(engine.fair_share.preempted)
    throughput = {"makespan": tokens / makespan, "busy": tokens / busy_s, "preempted": preempted}
    return results, throughput, shares


def summary(results: list[Result], throughput: dict, shares: list | None = None) -> dict:
    quiet = [r.ttft for r in results if r.tenant != "flood"]
    flood = [r.ttft for r in results if r.tenant == "flood"]
    flood_requests = len(flood)
    flood = flood or [float("nan")]
    return {
        "preemptions": throughput.get("preempted", {}),
        "shares": shares or [],
        "quiet_requests": len(quiet),
        "flood_requests": flood_requests,
        "quiet_ttft_p50_s": float(np.percentile(quiet, 50)),
        "quiet_ttft_p99_s": float(np.percentile(quiet, 99)),
        "flood_ttft_p50_s": float(np.percentile(flood, 50)),
        "flood_ttft_p99_s": float(np.percentile(flood, 99)),
        "output_tok_per_s": throughput["makespan"],
        # Output tokens per second of engine steps (idle time between arrivals left out).
        "output_tok_per_busy_s": throughput["busy"],
        "quiet_ttfts": sorted(quiet),
        "flood_ttfts": sorted(flood),
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, bars, share) = plt.subplots(1, 3, figsize=(15, 4), width_ratios=[2, 1, 2])
    colors = {"fcfs": "tab:red", "fair": "tab:blue", "alone": "tab:green"}
    for policy, s in report.items():
        if policy == "alone":
            values = s["quiet_ttfts"]
            cdf.plot(
                values,
                np.arange(1, len(values) + 1) / len(values),
                "--",
                color="tab:green",
                label="quiet tenants alone",
            )
            continue
        for key, style in (("quiet_ttfts", "-"), ("flood_ttfts", ":")):
            values = s[key]
            who = "quiet tenants" if key == "quiet_ttfts" else "flooding tenant"
            cdf.plot(
                values,
                np.arange(1, len(values) + 1) / len(values),
                style,
                color=colors.get(policy),
                label=f"{policy}: {who}",
            )
    cdf.set_xlabel("TTFT (s)")
    cdf.set_ylabel("fraction of requests")
    cdf.set_title("TTFT, one tenant flooding at 10x")
    cdf.legend()
    policies = [p for p in report if p != "alone"]
    for policy, style in (("fair", "-"), ("fcfs", ":")):
        if policy not in report:
            continue
        for tenant, t, part in tenant_shares(report[policy]["shares"]):
            share.plot(t, part, style, label=f"{policy}: {tenant}")
    share.set_xlabel("seconds")
    share.set_ylabel("share of the service in the last 2 s")
    share.set_title("Each tenant's share over time")
    share.legend(fontsize=7)
    bars.bar(
        policies,
        [report[p]["output_tok_per_busy_s"] for p in policies],
        color=[colors.get(p) for p in policies],
    )
    bars.set_ylabel("output tokens / s of engine steps")
    bars.set_title("Throughput")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def tenant_shares(shares: list, window: float = 2.0):
    """(tenant, times, its share of the weighted tokens served in each `window` s)."""
    if not shares:
        return []
    ends = np.arange(window, shares[-1][0] + window, window)
    times = np.array([t for t, _ in shares])
    out = []
    for tenant in TENANTS:
        served = np.array([s.get(tenant, 0.0) for _, s in shares])
        totals = np.array([sum(s.values()) for _, s in shares])
        at = np.searchsorted(times, ends, side="right") - 1
        before = np.searchsorted(times, ends - window, side="right") - 1
        mine = served[at] - np.where(before >= 0, served[np.maximum(before, 0)], 0.0)
        all_ = totals[at] - np.where(before >= 0, totals[np.maximum(before, 0)], 0.0)
        out.append((tenant, ends, np.divide(mine, all_, out=np.zeros_like(mine), where=all_ > 0)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--quiet-rate", type=float, default=0.05, help="requests/s per quiet")
    parser.add_argument("--flood-factor", type=float, default=10.0)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--policies", default="fcfs,fair")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--alone", action="store_true", help="also the quiet tenants alone")
    args = parser.parse_args()
    print(f"# load average {__import__('os').getloadavg()[0]:.2f}", flush=True)
    source = resolve_model(args.model)
    loras = adapters_for(source)
    arrivals = workload(args, vocab_size=load_config(source.hf_dir).vocab_size)
    report = {}
    runs = [(p, arrivals) for p in args.policies.split(",")]
    if args.alone:
        runs.append(("alone", [a for a in arrivals if a.tenant != "flood"]))
    for policy, chosen in runs:
        results, throughput, shares = run(
            args, "fair" if policy == "alone" else policy, chosen, loras
        )
        report[policy] = summary(results, throughput, shares)
        s = report[policy]
        print(
            f"{policy}: quiet TTFT p50 {s['quiet_ttft_p50_s']:.2f} s, p99 "
            f"{s['quiet_ttft_p99_s']:.2f} s ({s['quiet_requests']} requests); flood TTFT p50 "
            f"{s['flood_ttft_p50_s']:.2f} s, p99 {s['flood_ttft_p99_s']:.2f} s "
            f"({s['flood_requests']}); {s['output_tok_per_s']:.2f} output tok/s over the run, "
            f"{s['output_tok_per_busy_s']:.2f} per second of engine steps",
            flush=True,
        )
    for policy in ("fair", "fcfs"):
        if "alone" in report and policy in report:
            for q in ("p50", "p99"):
                ratio = report[policy][f"quiet_ttft_{q}_s"] / report["alone"][f"quiet_ttft_{q}_s"]
                print(f"{policy}: quiet TTFT {q} / alone: {ratio:.2f}x")
        if policy in report:
            print(f"{policy}: preemptions by tenant {report[policy]['preemptions']}")
    if "fcfs" in report and "fair" in report:
        for key in ("output_tok_per_s", "output_tok_per_busy_s"):
            cost = 1 - report["fair"][key] / report["fcfs"][key]
            print(f"throughput cost of fairness ({key}): {100 * cost:.1f}%")
    if args.plot is not None:
        plot(report, args.plot)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

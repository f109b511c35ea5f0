"""The sampler's cost on one decode step of 64 rows at the default model's vocabulary (49152),
float32 logits on the CPU: penalties over long histories, and top-p on flat and peaked rows.

    .venv/bin/python benchmarks/sampling.py                 # median ms per step of each case
    .venv/bin/python benchmarks/sampling.py --rounds 9 --threads 2

Rows are sampled from the persistent batch (engine/runner/input_batch.py), as the engine samples
them; each penalties step appends the sampled token, as the engine does. Each case prints the
median milliseconds per step and a digest of every token it sampled: run it on two checkouts
(PYTHONPATH at each one's loragate) and the digests say whether the tokens are the same.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import torch

from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Request, Sequence, sample_generator
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.sampling.sampler import Sampler
from loragate.engine.sampling.sampling_batch import StepRows

ROWS, VOCAB = 64, 49152


def batch_of(params: SamplingParams, prompt_len: int, output_len: int) -> tuple:
    """ROWS sequences with these parameters in a persistent batch, each with its history."""
    rng = torch.Generator().manual_seed(0)
    batch = InputBatch(ROWS, 4)
    seqs = []
    for i in range(ROWS):
        prompt = torch.randint(VOCAB, (prompt_len,), generator=rng).tolist()
        seq = Sequence(i, Request(f"r{i}", None, prompt, params), 0, sample_generator(i, 0))
        seq.token_ids += torch.randint(VOCAB, (output_len,), generator=rng).tolist()
        seq.block_table = [1]
        seqs.append(seq)
    batch.sync({seq.seq_id: seq for seq in seqs})
    rows = [batch.row_of[seq.seq_id] for seq in seqs]
    return batch, seqs, rows


def run_case(name: str, params: SamplingParams, scale: float, history: tuple, rounds: int):
    batch, seqs, rows = batch_of(params, *history)
    sampler = Sampler(VOCAB, {0}, torch.Generator().manual_seed(1))
    logits_rng = torch.Generator().manual_seed(2)
    digest = hashlib.sha256()
    times = []
    for _ in range(rounds + 1):  # the first step builds what later ones keep: not timed
        logits = torch.randn(ROWS, VOCAB, generator=logits_rng) * scale
        start = time.perf_counter()
        results = sampler(logits, StepRows(batch.sampling, rows, seqs))
        times.append((time.perf_counter() - start) * 1e3)
        tokens = [r.token_id for r in results]
        for seq, token in zip(seqs, tokens, strict=True):
            seq.token_ids.append(token)
        digest.update(str(tokens).encode())
    ms = statistics.median(times[1:])
    print(f"| {name} | {ms:.1f} | {times[0]:.1f} | {digest.hexdigest()[:12]} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    penalties = dict(repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.2)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {ROWS} rows x {VOCAB}")
    print("| case | median ms/step | first step ms | tokens digest |\n|---|---|---|---|")
    cases = [
        ("penalties, greedy, 1024 prompt + 256 output", dict(temperature=0.0, **penalties)),
        ("penalties, seeded t=0.8", dict(temperature=0.8, seed=0, **penalties)),
    ]
    for name, params in cases:
        run_case(name, SamplingParams(**params), 3.0, (1024, 256), args.rounds)
    for name, scale in [("flat (x0.5)", 0.5), ("nearly uniform (x0.01)", 0.01), ("peaked (x8)", 8)]:
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=0)
        run_case(f"top_p=0.95, {name}", params, scale, (8, 0), args.rounds)
        params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, seed=0)
        run_case(f"top_k=50 top_p=0.95, {name}", params, scale, (8, 0), args.rounds)


if __name__ == "__main__":
    main()

"""Decode at batch 1 against the memory-bandwidth bound (issue 59's first goal): a model's
weights are read once per token, so tokens/s can be at most the machine's bandwidth over
the bytes the model holds (an output layer tied to the embedding counts once: it is read
whole every token; an untied embedding's table is not, only its rows).

The bandwidth is measured here, in this process, on the threads the engine uses: a copy of
a 1 GiB float32 tensor (STREAM's count: the bytes read plus the bytes written) and a sum
over it (bytes read), best of five each. The decode figure is the time per token of a
greedy, single-stream generation, from two runs that differ only in length (so prefill and
the first step cancel out), best of ``--rounds``. Name the CPU and load with the figures
(printed first).

    .venv/bin/python benchmarks/decode_bandwidth.py                       # the default Q4_1
    .venv/bin/python benchmarks/decode_bandwidth.py --model /tmp/llama-1b --quantization int4

`--llama-bench` also runs llama.cpp's `llama-bench` (tg, the same token count, the same
threads, OpenMP waiting passively; ../shared/peers/setup_llamacpp.sh builds it) on the same
GGUF file, after loragate's runs, and prints its tokens/s beside loragate's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import torch

from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.default_model import default_model_path
from loragate.kernels.cpu_isa import this_cpu_flags

GIB = 1 << 30


def bandwidth() -> tuple[float, float]:
    """(copy GB/s counting read + write, read GB/s), best of five."""
    src = torch.ones(GIB // 4)
    dst = torch.empty_like(src)
    copies, reads = [], []
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        copies.append(2 * GIB / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        src.sum()
        reads.append(GIB / (time.perf_counter() - start) / 1e9)
    return max(copies), max(reads)


def bytes_per_token(llm: LLM) -> tuple[int, dict[str, int]]:
    model = llm.llm_engine.model
    held = model.weight_bytes()
    total = sum(held.values())
    embed = model.embed_tokens
    if model.lm_head is not embed:  # untied: the embedding's table is not read whole
        total -= embed.nbytes if hasattr(embed, "nbytes") else embed.numel() * embed.element_size()
    return total, held


def seconds_per_token(llm: LLM, prompt, tokens: int, rounds: int) -> float:
    def timed(n: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - start

    timed(4)  # warm
    best = float("inf")
    for _ in range(rounds):
        long, short = timed(tokens + 1), timed(1)
        best = min(best, (long - short) / tokens)
    return best


def llama_bench(model: Path, tokens: int, rounds: int, threads: int) -> float:
    """llama-bench's tg tokens/s on ``model`` (mean of ``rounds`` repetitions)."""
    peers = Path(os.environ.get("LORAGATE_PEERS", Path.home() / ".cache" / "loragate-peers"))
    binary = peers / "llamacpp" / "bin" / "llama-bench"
    if not binary.is_file():
        raise SystemExit(f"{binary} is missing: run ../shared/peers/setup_llamacpp.sh")
    command = [str(binary), "-m", str(model), "-p", "0", "-n", str(tokens)]
    command += ["-t", str(threads), "-r", str(rounds), "-o", "json"]
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    runs = [r for r in json.loads(done.stdout) if r["n_gen"] == tokens]
    return runs[0]["avg_ts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF directory or GGUF file (default model)")
    ap.add_argument("--quantization", default=None, choices=[None, "int8", "int4"])
    ap.add_argument("--gguf-dequantize", action="store_true")
    ap.add_argument("--activation-quantization", choices=["int8"], help="the optional mode")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-bench", action="store_true", help="also llama.cpp on the file")
    args = ap.parse_args()
    flags = sorted(f for f in this_cpu_flags() if f.startswith(("avx", "amx", "f16c", "fma")))
    print(f"# flags {' '.join(flags)}; threads {torch.get_num_threads()}")
    print(f"# load average {os.getloadavg()[0]:.2f}")
    copy_bw, read_bw = bandwidth()
    print(f"# bandwidth: copy {copy_bw:.1f} GB/s (read + write), read {read_bw:.1f} GB/s")
    llm = LLM(
        model=args.model,
        quantization=args.quantization,
        gguf_dequantize=args.gguf_dequantize,
        activation_quantization=args.activation_quantization,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_gb=0.25,
    )
    per_token, held = bytes_per_token(llm)
    prompt = {"prompt_token_ids": llm.apply_chat_template([{"role": "user", "content": "Hi"}])}
    seconds = seconds_per_token(llm, prompt, args.tokens, args.rounds)
    rate = 1 / seconds
    moved = per_token * rate / 1e9
    kinds = ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in sorted(held.items()))
    print(f"# weights held: {kinds}; read per token {per_token / 1e6:.1f} MB")
    print("| model | weights | MB read / token | tok/s | GB/s read | of read bw | of copy bw |")
    print("|---|---|---|---|---|---|---|")
    name = args.model or "default (SmolLM2-135M Q4_1 GGUF)"
    how = args.quantization or ("float32" if args.gguf_dequantize else "as held")
    if args.activation_quantization:
        how += f", {args.activation_quantization} activations"
    print(
        f"| {name} | {how} | {per_token / 1e6:.1f} | {rate:.1f} | {moved:.1f} "
        f"| {moved / read_bw:.0%} | {moved / copy_bw:.0%} |"
    )
    print(f"# load average after {os.getloadavg()[0]:.2f}")
    if args.llama_bench:
        model = Path(args.model) if args.model else default_model_path()
        del llm  # its weights out of memory before llama.cpp maps the file
        theirs = llama_bench(model, args.tokens, args.rounds, torch.get_num_threads())
        print(
            f"# llama-bench tg{args.tokens}, {torch.get_num_threads()} threads: {theirs:.1f} tok/s"
        )
        print(f"# loragate / llama.cpp: {rate / theirs:.2f}x")


if __name__ == "__main__":
    main()

"""Offline throughput: the engine against HF transformers static batches, in one run.

N chat requests with mixed prompt and output lengths, greedy, EOS ignored. HF runs them
in static batches (left-padded), each batch generating until its longest request is done,
which is how static batching spends compute; only the requested tokens count as output.

    .venv/bin/python benchmarks/throughput.py --num-requests 128 --max-num-seqs 64
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import (
    add_engine_args,
    engine_options,
    generate_seconds,
    machine_line,
    print_table,
    static_batch_seconds,
)
from offline_workloads import topic_requests
from transformers import AutoModelForCausalLM

from loragate.engine import LLM
from loragate.engine.loading.model_loader import resolve_model


def matmul_gflops(device: torch.device, dtype: torch.dtype, reps: int = 5) -> float:
    """The measured matmul rate in the engine's dtype: the roofline's compute ceiling."""
    size = 8192 if device.type == "cuda" else 2048
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size**3 * reps / (time.perf_counter() - start) / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flops_per_token(model) -> float:
    """2 FLOPs per weight in every matmul a decoded token passes through (lm_head included)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    q = c.num_attention_heads * head_dim
    per_layer = (
        c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    return 2 * (c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_engine_args(ap)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args()

    llm = LLM(**engine_options(args))
    device, dtype = llm.engine.config.torch_device, llm.engine.config.torch_dtype
    requests = topic_requests(args.num_requests, args.seed)
    prompts = [llm.apply_chat_template(messages) for messages, _ in requests]
    lengths = [n for _, n in requests]
    total = sum(lengths)
    generate_seconds(llm, prompts[:4], [8] * 4)  # warm-up
    engine_s = generate_seconds(llm, prompts, lengths)
    engine_tps = total / engine_s

    # Steady decode: max_num_seqs sequences, short prompts, long outputs.
    decode_n = args.max_num_seqs
    decode_s = generate_seconds(llm, [prompts[0][:16]] * decode_n, [128] * decode_n)
    decode_tps = decode_n * 128 / decode_s

    peak = matmul_gflops(device, dtype)
    hf_dir = resolve_model(args.model).hf_dir  # HF weights (the engine's may be GGUF blocks)
    hf_model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=dtype)
    hf_model = hf_model.to(device).eval()
    per_token = flops_per_token(hf_model)
    hf_tps = None
    if not args.skip_hf:
        hf_s = static_batch_seconds(hf_model, prompts, lengths, args.hf_batch, pad_id=2)
        hf_tps = total / hf_s

    print(machine_line(device) + f"; dtype {str(dtype).split('.')[-1]}")
    print(
        f"# requests: {args.num_requests}, output tokens: {total}, "
        f"prompt tokens: {sum(map(len, prompts))}, max_num_seqs: {args.max_num_seqs}"
    )
    rows = []
    if hf_tps:
        rows.append([f"HF transformers, static batch {args.hf_batch}", f"{hf_tps:.1f}", "1.00x"])
    ratio = f"{engine_tps / hf_tps:.2f}x" if hf_tps else "-"
    rows.append(["loragate engine, mixed workload", f"{engine_tps:.1f}", ratio])
    ratio = f"{decode_tps / hf_tps:.2f}x" if hf_tps else "-"
    rows.append([f"loragate engine, steady decode x{decode_n}", f"{decode_tps:.1f}", ratio])
    print_table(["system", "tokens/s", "vs HF"], rows)
    print(f"matmul peak: {peak:.1f} GFLOP/s; decode FLOPs/token: {per_token / 1e6:.1f} M")
    print(
        f"decode roofline share: {decode_tps * per_token / 1e9 / peak:.1%} "
        f"(bound ~{peak * 1e9 / per_token:.0f} tok/s)"
    )


if __name__ == "__main__":
    main()

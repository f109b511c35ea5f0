"""Times the model's forward pass at a few sizes at start, for the step budget.

Runs before any request, on KV blocks nobody holds yet (each run overwrites what the one
before wrote; real requests overwrite it all before they read it).
"""

from __future__ import annotations

import time

import torch

from loragate.engine.runner.forward_batch import ForwardBatch, PrefillAttention
from loragate.engine.runner.kv_cache import KVCache

WARMUP_SIZES = (16, 128)  # tokens: a decode-sized step and a prompt chunk
REPEATS = 2  # the fastest of these counts; the first run pays one-time costs


def time_forward(
    model, kv_cache: KVCache, max_model_len: int, sizes=WARMUP_SIZES
) -> dict[int, float]:
    """Milliseconds of one forward pass (logits of one row included) per token count."""
    bs, blocks = kv_cache.block_size, kv_cache.data.shape[2]
    timings: dict[int, float] = {}
    for _ in range(REPEATS):
        for n in sizes:
            n = min(n, bs * blocks, max_model_len)
            batch = _prompt_batch(n, bs, model.device, model.vocab_size)
            start = time.perf_counter()
            with torch.inference_mode():
                model.compute_logits(model.forward(batch, kv_cache))
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            ms = (time.perf_counter() - start) * 1e3
            timings[n] = min(ms, timings.get(n, ms))
    return timings


def _prompt_batch(n: int, block_size: int, device: torch.device, vocab: int) -> ForwardBatch:
    """One prompt of n tokens (ids inside the vocabulary, however small) in blocks 0, 1, ...:
    the shape of a prefill chunk."""
    num_blocks = -(-n // block_size)

    def tensor(data, dtype):
        return torch.tensor(data, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=tensor([(7 * i + 1) % min(vocab, 1000) for i in range(n)], torch.long),
        positions=tensor(list(range(n)), torch.long),
        slot_mapping=tensor(list(range(n)), torch.long),
        prefill=PrefillAttention(
            block_tables=tensor([list(range(num_blocks))], torch.int32),
            seq_lens=tensor([n], torch.int32),
            query_start_loc=tensor([0, n], torch.int32),
            num_tokens=n,
        ),
        decode=None,
        sample_indices=tensor([n - 1], torch.long),
    )

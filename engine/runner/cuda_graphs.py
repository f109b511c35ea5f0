"""Decode steps replayed from CUDA graphs: one launch per step instead of hundreds.

On a GPU the engine is host-bound: a decode step launches several hundred kernels (a
thousand more with LoRA), each costing microseconds of Python, while the GPU's own work is
well under a millisecond. A decode-only step's shapes are known in advance up to its batch
size, so its forward pass is captured once per batch-size bucket and LoRA rank, then
replayed: each step writes its inputs into the static tensors the graph reads (block tables
cut from the runner's persistent batch, engine/runner/input_batch.py), padded to the bucket with
rows that touch nothing (KV slot -1: no cache write; no adapter; a context
of one token). Adapter slots and the KV cache never move, so the graph reads whatever they
hold when it replays.

Steps with prompt tokens run eagerly, and `enforce_eager=True` turns graphs off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from loragate import kernels
from loragate.engine.core.scheduler import ScheduledSeq, SchedulerOutput
from loragate.engine.runner.forward_batch import DecodeAttention, ForwardBatch, LoRABatch
from loragate.engine.runner.kv_cache import KVCache

log = logging.getLogger(__name__)


class GraphCaptureError(RuntimeError):
    """A decode step could not be captured: the engine goes on without graphs."""


# Batch sizes a graph is captured for (vLLM's choice): a decode step of B sequences runs the
# smallest bucket >= B, so at most 7 rows a step are padding.
SMALL_BUCKETS = (1, 2, 4, 8)
BUCKET_STEP = 8


def batch_buckets(max_batch: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, ..., max_batch]: the largest is max_batch itself."""
    steps = range(BUCKET_STEP, max_batch, BUCKET_STEP)
    return sorted({b for b in (*SMALL_BUCKETS, *steps) if b < max_batch} | {max_batch})


def decode_graphs_for(config, runner, max_model_len: int) -> DecodeGraphs | None:
    """The runner's graphs: on CUDA unless enforce_eager (the CPU has none)."""
    if runner.model.device.type != "cuda" or config.enforce_eager:
        return None
    return DecodeGraphs(
        runner.model,
        runner.kv_cache,
        runner.adapter_slots,
        runner.lora_rank,
        max_batch=config.max_num_seqs,
        max_model_len=max_model_len,
    )


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [bucket, vocab], written by every replay
    # The batch it was captured over: the graph reads its tensors at their addresses, and
    # some are its own (the static LoRA index's row order), not views of the static inputs.
    # Dropped, their memory would go back to the allocator and a replay read what came next.
    batch: ForwardBatch


class DecodeGraphs:
    """Static input tensors, the graphs captured over them, and the step that fills them.

    capture=False runs the same padded static batch eagerly: the CPU tests check the padding
    that way, since graphs need CUDA. Then keep=True goes one step further towards what a
    graph replays: each (bucket, rank)'s batch is built once, over the static LoRA index, and
    kept; every later step rewrites its inputs in place and runs that same batch again. The
    static index drives the Triton LoRA kernels only, so off CUDA the kept batch names
    backend "triton" (the interpreter, TRITON_INTERPRET=1, as the CPU tests set).
    """

    def __init__(
        self,
        model,
        kv_cache: KVCache,
        adapter_slots,
        rank_of,
        *,
        max_batch: int,
        max_model_len: int,
        capture: bool = True,
        keep: bool = False,
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.adapter_slots = adapter_slots  # the AdapterResidency, or None without LoRA
        self.rank_of = rank_of  # () -> the LoRA rank the eager path would run now
        self.capture = capture
        self.keep = keep and not capture  # a captured graph keeps its batch anyway
        # Built once per (bucket, rank) and run again every step, as a graph replays it.
        self.kept: dict[tuple[int, int], ForwardBatch] = {}
        self.buckets = batch_buckets(max_batch)
        self.block_size = kv_cache.block_size
        self.max_blocks = -(-max_model_len // self.block_size)
        size, device = self.buckets[-1], model.device
        # ids, positions, KV slots, adapter slots: one host-to-device copy a step.
        self.rows = torch.zeros(4, size, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(size, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(size, self.max_blocks, dtype=torch.int32, device=device)
        slots = adapter_slots.max_loras if adapter_slots is not None else 1
        self.group_ends = torch.zeros(slots, dtype=torch.int32, device=device)
        self.sample_rows = torch.arange(size, device=device)
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self._pool = None
        self.replays = 0  # steps served from a graph (or, capture=False, the static batch)
        self.padded_rows = 0
        self.keys_run: set[tuple[int, int]] = set()  # (bucket, LoRA rank; 0 = no LoRA)

    def fits(self, scheduled: SchedulerOutput) -> bool:
        return (
            not scheduled.prefills
            and 0 < len(scheduled.decodes) <= self.buckets[-1]
            and not self._row_extras_in(scheduled.decodes)
            and not any(item.draft for item in scheduled.decodes)
        )

    def _row_extras_in(self, decodes: list[ScheduledSeq]) -> bool:
        """Rows of DoRA, lora_B-bias and vocabulary-side adapters run eagerly: which rows
        they are is not part of a captured graph."""
        if self.adapter_slots is None:
            return False
        slots = self.adapter_slots.slot_tensors
        extra = {*slots.extra_slots, *slots.vocab_slots}
        return bool(extra) and any(item.seq.lora_slot in extra for item in decodes)

    def run(self, decodes: list[ScheduledSeq], tables: torch.Tensor) -> torch.Tensor:
        """Logits [len(decodes), vocab] float32; decodes grouped by slot, base-only last.
        `tables` are their rows of the runner's persistent batch (engine/runner/input_batch.py),
        [len(decodes), widest table] int32."""
        n = len(decodes)
        bucket = next(b for b in self.buckets if b >= n)
        rank = self._write_inputs(decodes, tables, bucket)
        self.replays += 1
        self.padded_rows += bucket - n
        self.keys_run.add((bucket, rank))
        if self.adapter_slots is not None:
            # A slot copy still pending (adapters/slot_copies.py) is waited for here: a
            # captured graph cannot wait on an event recorded outside it.
            self.adapter_slots.slot_tensors.wait_all()
        if self.keep:
            batch = self.kept.get((bucket, rank))
            if batch is None:
                batch = self.kept[(bucket, rank)] = self._batch(bucket, rank)
            return self._forward(batch)[:n]
        if not self.capture:
            return self._forward(self._batch(bucket, rank))[:n]
        captured = self.graphs.get((bucket, rank))
        if captured is None:
            captured = self.graphs[(bucket, rank)] = self._capture(self._batch(bucket, rank))
        captured.graph.replay()
        # A copy: the next replay overwrites the static logits while these may still be read.
        return captured.logits[:n].clone()

    def _write_inputs(self, decodes: list[ScheduledSeq], tables: torch.Tensor, bucket: int) -> int:
        """The static inputs for `decodes`: each one's token and position, and its block
        table cut from the persistent batch (padding rows read block 0, write nowhere)."""
        n, bs = len(decodes), self.block_size
        ids, positions, lora_slots = [], [], []
        for item in decodes:
            seq = item.seq
            p = seq.num_computed_tokens
            ids.append(seq.token_ids[p])
            positions.append(p)
            lora_slots.append(seq.lora_slot)
        pad = bucket - n
        rows = torch.tensor(
            [ids + [0] * pad, positions + [0] * pad, [-1] * bucket, lora_slots + [-1] * pad],
            dtype=torch.long,
        )
        at = rows[1, :n]
        rows[2, :n] = tables[torch.arange(n), at // bs].to(torch.long) * bs + at % bs
        self.rows[:, :bucket].copy_(rows)
        self.seq_lens[:bucket].copy_((rows[1, :bucket] + 1).to(torch.int32))
        padded = torch.zeros(bucket, self.max_blocks, dtype=torch.int32)
        padded[:n, : tables.shape[1]] = tables
        self.block_tables[:bucket].copy_(padded)
        if self.adapter_slots is None or all(s < 0 for s in lora_slots):
            return 0
        counts = [0] * self.group_ends.shape[0]
        for slot in lora_slots:
            if slot >= 0:
                counts[slot] += 1
        ends, total = [], 0
        for c in counts:
            total += c
            ends.append(total)
        self.group_ends.copy_(torch.tensor(ends, dtype=torch.int32))
        return self.rank_of()

    def _batch(self, bucket: int, rank: int) -> ForwardBatch:
        lora = None
        if rank:
            slot_ids = self.rows[3, :bucket]
            num_slots = self.adapter_slots.max_loras
            static = self.capture or self.keep
            index = (
                kernels.static_lora_index(slot_ids, self.group_ends, num_slots)
                if static
                else kernels.lora_index(slot_ids, num_slots)
            )
            weights = self.adapter_slots.slot_tensors
            # Off CUDA only the kept batch names a backend: the Triton interpreter, the one
            # CPU path that takes the static index.
            backend = "triton" if self.keep and self.model.device.type != "cuda" else None
            lora = LoRABatch(
                weights=weights, slot_ids=slot_ids, index=index, rank=rank, backend=backend
            )
        return ForwardBatch(
            input_ids=self.rows[0, :bucket],
            positions=self.rows[1, :bucket],
            slot_mapping=self.rows[2, :bucket],
            prefill=None,
            decode=DecodeAttention(
                block_tables=self.block_tables[:bucket], seq_lens=self.seq_lens[:bucket]
            ),
            sample_indices=self.sample_rows[:bucket],
            lora=lora,
        )

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        return self.model.compute_logits(self.model.forward(batch, self.kv_cache), batch)

    def _capture(self, batch: ForwardBatch) -> _Captured:
        try:
            return self._capture_unchecked(batch)
        except Exception as exc:
            raise GraphCaptureError(f"CUDA graph capture failed: {exc}") from exc

    def _capture_unchecked(self, batch: ForwardBatch) -> _Captured:
        # A warm-up run compiles the Triton kernels and sets cuBLAS up outside the capture.
        # It computes this very step, so the KV it writes is what the replay writes again.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(batch)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self._forward(batch)
        if self._pool is None:
            self._pool = graph.pool()
        return _Captured(graph, logits, batch)

"""Builds one flat ForwardBatch from the scheduler's choice and runs the model on it."""

from __future__ import annotations

import logging

import torch

from loragate import kernels
from loragate.engine.cuda_graphs import DecodeGraphs, GraphCaptureError
from loragate.engine.forward_batch import DecodeAttention, ForwardBatch, LoRABatch, PrefillAttention
from loragate.engine.kv_cache import KVCache
from loragate.engine.models.llama import LlamaForCausalLM
from loragate.engine.scheduler import ScheduledSeq, SchedulerOutput
from loragate.engine.sequence import Sequence
from loragate.engine.step_record import StepClock

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_cache: KVCache,
        block_manager,
        adapters=None,
        decode_graphs: DecodeGraphs | None = None,
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.adapters = adapters  # the AdapterCache, when LoRA is enabled
        self.num_computed_tokens_total = 0  # prefill + decode tokens run through the model
        self.decode_graphs = decode_graphs  # CUDA graphs for decode-only steps, when allowed
        self._prompt_rows: list[tuple[Sequence, int]] = []  # this step's prompt-logprob rows

    def run(
        self, scheduled: SchedulerOutput, clock: StepClock | None = None
    ) -> tuple[list[Sequence], torch.Tensor]:
        """Logits [N, vocab] float32 for the sequences that sample this step, in that order.
        `clock` (the step's) gets the prepare and forward phases."""
        clock = clock or StepClock()
        self._copy_on_write()
        if self.decode_graphs is not None and self.decode_graphs.fits(scheduled):
            try:
                sampled, logits = self._run_graph(sorted(scheduled.decodes, key=_slot_order))
                clock.lap("forward")
                return sampled, logits
            except GraphCaptureError:
                # The warm-up before a capture computes the step itself, so whatever KV it
                # wrote is what the eager pass below writes again.
                log.warning("decode steps run eagerly from now on", exc_info=True)
                self.decode_graphs = None
        batch, sampled = self.prepare(scheduled)
        clock.lap("prepare")
        hidden = self.model.forward(batch, self.kv_cache)
        self.num_computed_tokens_total += batch.num_tokens
        logits = self.model.compute_logits(hidden)
        if self._prompt_rows:
            record_prompt_logprobs(self._prompt_rows, logits[len(sampled) :])
            logits = logits[: len(sampled)]
        clock.lap("forward")
        return sampled, logits

    def _run_graph(self, decodes: list[ScheduledSeq]) -> tuple[list[Sequence], torch.Tensor]:
        logits = self.decode_graphs.run(decodes)
        self.num_computed_tokens_total += len(decodes)
        rows = [i for i, item in enumerate(decodes) if item.samples]
        if len(rows) < len(decodes):
            logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
        return [decodes[i].seq for i in rows], logits

    def lora_rank(self) -> int:
        """The rank the LoRA kernels run at: the largest resident one, aligned."""
        return _aligned_rank(self.adapters.effective_rank, self.adapters.max_lora_rank)

    def _copy_on_write(self) -> None:
        copies = self.block_manager.take_copies()
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.kv_cache.data[:, :, dst] = self.kv_cache.data[:, :, src]

    def prepare(self, scheduled: SchedulerOutput) -> tuple[ForwardBatch, list[Sequence]]:
        # Grouped by adapter slot, base-model rows last, so every LoRA call of the pass
        # reads its rows in place instead of gathering and scattering them.
        prefills = sorted(scheduled.prefills, key=_slot_order)
        decodes = sorted(scheduled.decodes, key=_slot_order)
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        lora_slots: list[int] = []
        sample_indices: list[int] = []
        sampled: list[Sequence] = []
        prompt_indices: list[int] = []
        self._prompt_rows: list[tuple[Sequence, int]] = []
        for item in prefills + decodes:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            for p in _prompt_positions_wanted(seq, start, end):
                prompt_indices.append(len(input_ids) + p - start)
                self._prompt_rows.append((seq, p))
            input_ids += seq.token_ids[start:end]
            pos = range(start, end)
            positions += pos
            table, bs = seq.block_table, self.block_size
            slots += [table[p // bs] * bs + p % bs for p in pos]
            lora_slots += [seq.lora_slot] * item.num_new_tokens
            if item.samples:
                sample_indices.append(len(input_ids) - 1)
                sampled.append(seq)
        batch = ForwardBatch(
            input_ids=self._tensor(input_ids, torch.long),
            positions=self._tensor(positions, torch.long),
            slot_mapping=self._tensor(slots, torch.long),
            prefill=self._prefill_attention(prefills),
            decode=self._decode_attention(decodes),
            # Rows whose logits are computed: the sampled ones, then prompt-logprob ones.
            sample_indices=self._tensor(sample_indices + prompt_indices, torch.long),
            lora=self._lora_batch(lora_slots),
        )
        return batch, sampled

    def _prefill_attention(self, items: list[ScheduledSeq]) -> PrefillAttention | None:
        if not items:
            return None
        starts = [0]
        for item in items:
            starts.append(starts[-1] + item.num_new_tokens)
        return PrefillAttention(
            block_tables=self._block_tables([i.seq for i in items]),
            seq_lens=self._tensor(
                [i.seq.num_computed_tokens + i.num_new_tokens for i in items], torch.int32
            ),
            query_start_loc=self._tensor(starts, torch.int32),
            num_tokens=starts[-1],
        )

    def _decode_attention(self, items: list[ScheduledSeq]) -> DecodeAttention | None:
        if not items:
            return None
        return DecodeAttention(
            block_tables=self._block_tables([i.seq for i in items]),
            seq_lens=self._tensor([i.seq.num_computed_tokens + 1 for i in items], torch.int32),
        )

    def _lora_batch(self, lora_slots: list[int]) -> LoRABatch | None:
        if self.adapters is None or all(s < 0 for s in lora_slots):
            return None
        slot_ids = self._tensor(lora_slots, torch.long)
        return LoRABatch(
            weights=self.adapters,
            slot_ids=slot_ids,
            index=kernels.lora_index(slot_ids, self.adapters.max_loras),
            rank=self.lora_rank(),
        )

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        rows = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        return self._tensor(rows, torch.int32)

    def _tensor(self, data, dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)


def _prompt_positions_wanted(seq: Sequence, start: int, end: int) -> range:
    """Positions p in [start, end) whose logits give a prompt token's logprob (that of
    token p + 1) not yet recorded: a recompute after preemption records nothing twice."""
    got = seq.request.prompt_logprobs
    if got is None or seq.index != 0:
        return range(0)
    first = max(start, len(got) - 1)
    return range(first, min(end, seq.prompt_len - 1))


def record_prompt_logprobs(rows: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
    """Each row's {next prompt token: logprob, top-N alternatives: logprob}, appended in
    prompt order to its request's prompt_logprobs."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    actual = torch.tensor([seq.token_ids[p + 1] for seq, p in rows], device=logits.device)
    chosen = logprobs.gather(1, actual[:, None])[:, 0].tolist()
    top_n = max(seq.request.params.prompt_logprobs for seq, _ in rows)
    top_values, top_ids = (
        logprobs.topk(min(top_n, logprobs.shape[1]), dim=-1) if top_n else (None, None)
    )
    for i, (seq, p) in enumerate(rows):
        n = seq.request.params.prompt_logprobs
        entry = {}
        if n:
            entry = dict(zip(top_ids[i, :n].tolist(), top_values[i, :n].tolist(), strict=True))
        entry[seq.token_ids[p + 1]] = chosen[i]
        seq.request.prompt_logprobs.append(entry)


def _slot_order(item: ScheduledSeq) -> float:
    slot = item.seq.lora_slot
    return slot if slot >= 0 else float("inf")


def _aligned_rank(rank: int, max_rank: int) -> int:
    """Round up to a multiple of 4 (zero padding) so LoRA matmuls keep 16-byte strides."""
    return min(max_rank, -(-rank // 4) * 4)

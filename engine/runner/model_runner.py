"""Runs the scheduler's choice: the persistent batch (InputBatch) brought up to date from
the SchedulerOutput, one flat ForwardBatch through the model, then each sampling row's token
(or beam row's log-probs) as a ModelRunnerOutput. The runner is the only owner of the
InputBatch: no other module reads or writes it (tests/engine/test_step_ownership.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from loragate import kernels
from loragate.engine.core.beam_search import beam_logprobs
from loragate.engine.core.scheduler import ScheduledSeq, SchedulerOutput, slot_order
from loragate.engine.core.sequence import Sequence
from loragate.engine.core.step_record import StepClock
from loragate.engine.models import PagedDecoder
from loragate.engine.runner.cuda_graphs import DecodeGraphs, GraphCaptureError
from loragate.engine.runner.forward_batch import (
    DecodeAttention,
    ForwardBatch,
    LoRABatch,
    PrefillAttention,
)
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.runner.kv_cache import KVCache
from loragate.engine.sampling.sample_dispatch import SampleDispatcher
from loragate.engine.speculation import verify_drafts

log = logging.getLogger(__name__)


@dataclass
class ModelRunnerOutput:
    """What a step computed: each sampling sequence's SampleResult (or the exception that
    failed it), and each beam's log-probs (or the error of its request's processors)."""

    sampled: list[Sequence] = field(default_factory=list)
    samples: list = field(default_factory=list)
    beams: list[tuple[Sequence, object]] = field(default_factory=list)


class ModelRunner:
    def __init__(
        self,
        model: PagedDecoder,
        kv_cache: KVCache,
        adapter_slots=None,
        decode_graphs: DecodeGraphs | None = None,
        *,
        sampler=None,
        plugins=None,
        max_num_seqs: int = 64,
        max_model_len: int = 2048,
    ):
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = model.device
        self.adapter_slots = adapter_slots  # the AdapterResidency, when LoRA is enabled
        self.num_computed_tokens_total = 0  # prefill + decode tokens run through the model
        self.decode_graphs = decode_graphs  # CUDA graphs for decode-only steps, when allowed
        self._prompt_rows: list[tuple[Sequence, int]] = []  # this step's prompt-logprob rows
        self._drafted: list[tuple[Sequence, list[int]]] = []  # this step's speculating rows
        # Block tables persist between steps, a row per sequence (engine/runner/input_batch.py).
        self.input_batch = InputBatch(max_num_seqs, -(-max_model_len // self.block_size))
        # Which sampler each row uses; the built-in one reads the rows' sampling columns.
        self.dispatcher = SampleDispatcher(sampler, plugins, self.input_batch)

    def execute(
        self, scheduled: SchedulerOutput, clock: StepClock | None = None
    ) -> ModelRunnerOutput:
        """Run the step: each sampling sequence's token, each beam's log-probs. `clock` (the
        step's) gets the prepare, forward and sample phases."""
        clock = clock or StepClock()
        self.input_batch.sync(scheduled.changed_tables)
        self._copy_on_write(scheduled.copies)
        if scheduled.empty:
            return ModelRunnerOutput()
        sampled, logits = self.run(scheduled, clock)
        drafted, verify_logits = self._drafted, logits[len(sampled) :]
        sampled, logits = _with_forks(sampled, logits[: len(sampled)], scheduled.forks)
        out = ModelRunnerOutput()
        beam_rows = [i for i, s in enumerate(sampled) if s.request.beam is not None]
        if beam_rows:  # beam groups take log-probs; the rest goes on to the sampler
            seqs = [sampled[i] for i in beam_rows]
            rows = beam_logprobs(seqs, logits[beam_rows], self.dispatcher.apply_logits_processors)
            out.beams = list(zip(seqs, rows, strict=True))
            rest = [i for i, s in enumerate(sampled) if s.request.beam is None]
            sampled, logits = [sampled[i] for i in rest], logits[rest]
        if sampled:
            out.sampled, out.samples = sampled, self.dispatcher.sample(sampled, logits)
        if drafted:  # speculating rows: the tokens each takes, verified position by position
            seqs, drafts = [seq for seq, _ in drafted], [draft for _, draft in drafted]
            out.sampled += seqs
            out.samples += verify_drafts(self.dispatcher.sample, seqs, drafts, verify_logits)
        clock.lap("sample")
        return out

    def run(
        self, scheduled: SchedulerOutput, clock: StepClock | None = None
    ) -> tuple[list[Sequence], torch.Tensor]:
        """Logits [N, vocab] float32 for the sequences that sample this step, in that order,
        then the rows of each speculating sequence's positions (`self._drafted`'s order).
        `clock` (the step's) gets the prepare and forward phases."""
        clock = clock or StepClock()
        self._drafted = []
        if self.decode_graphs is not None and self.decode_graphs.fits(scheduled):
            try:
                sampled, logits = self._run_graph(sorted(scheduled.decodes, key=slot_order))
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
        logits = self.model.compute_logits(hidden, batch)
        if self._prompt_rows:
            rows = len(sampled) + sum(len(draft) + 1 for _, draft in self._drafted)
            record_prompt_logprobs(self._prompt_rows, logits[rows:])
            logits = logits[:rows]
        clock.lap("forward")
        return sampled, logits

    def _run_graph(self, decodes: list[ScheduledSeq]) -> tuple[list[Sequence], torch.Tensor]:
        tables = self.input_batch.tables([item.seq for item in decodes])
        logits = self.decode_graphs.run(decodes, tables)
        self.num_computed_tokens_total += len(decodes)
        rows = [i for i, item in enumerate(decodes) if item.samples]
        if len(rows) < len(decodes):
            logits = logits[torch.tensor(rows, dtype=torch.long, device=logits.device)]
        return [decodes[i].seq for i in rows], logits

    def lora_rank(self) -> int:
        """The rank the LoRA kernels run at: the largest resident one, aligned."""
        slots = self.adapter_slots
        return _aligned_rank(slots.effective_rank, slots.max_lora_rank)

    def _copy_on_write(self, copies: list[tuple[int, int]]) -> None:
        if copies:
            src = torch.tensor([s for s, _ in copies], device=self.device)
            dst = torch.tensor([d for _, d in copies], device=self.device)
            self.kv_cache.data[:, :, dst] = self.kv_cache.data[:, :, src]

    def prepare(self, scheduled: SchedulerOutput) -> tuple[ForwardBatch, list[Sequence]]:
        """The step's inputs: each sequence's new tokens, and tensors cut from the persistent
        batch (block tables) and built per sequence, never per token."""
        # Grouped by adapter slot, base-model rows last, so every LoRA call of the pass
        # reads its rows in place instead of gathering and scattering them.
        # Speculating decodes run several tokens each, so with the prompts' attention.
        drafted = sorted((d for d in scheduled.decodes if d.draft), key=slot_order)
        prefills = sorted(scheduled.prefills, key=slot_order) + drafted
        decodes = sorted((d for d in scheduled.decodes if not d.draft), key=slot_order)
        items = prefills + decodes
        starts = [item.seq.num_computed_tokens for item in items]
        counts = [item.num_new_tokens for item in items]
        tables = self.input_batch.tables([item.seq for item in items])
        input_ids: list[int] = []
        sample_indices: list[int] = []
        sampled: list[Sequence] = []
        verify_indices: list[int] = []  # every position of each speculating row
        prompt_indices: list[int] = []
        self._prompt_rows: list[tuple[Sequence, int]] = []
        self._drafted = [(item.seq, item.draft) for item in drafted]
        for item, start, count in zip(items, starts, counts, strict=True):
            seq = item.seq
            for p in _prompt_positions_wanted(seq, start, start + count):
                prompt_indices.append(len(input_ids) + p - start)
                self._prompt_rows.append((seq, p))
            if item.draft:
                verify_indices += range(len(input_ids), len(input_ids) + count)
                input_ids += seq.token_ids[start:] + item.draft
            else:
                input_ids += seq.token_ids[start : start + count]
            if item.samples and not item.draft:
                sample_indices.append(len(input_ids) - 1)
                sampled.append(seq)
        positions, rows = token_positions(starts, counts)
        slots = slot_mapping(tables, rows, positions, self.block_size)
        lora_slots = torch.tensor([item.seq.lora_slot for item in items], dtype=torch.long)
        num_prefills = len(prefills)
        batch = ForwardBatch(
            input_ids=self._tensor(input_ids, torch.long),
            positions=positions.to(self.device),
            slot_mapping=slots.to(self.device),
            prefill=self._prefill_attention(prefills, tables[:num_prefills]),
            decode=self._decode_attention(decodes, tables[num_prefills:]),
            # Rows whose logits are computed: the sampled ones, the speculating rows'
            # positions, then prompt-logprob ones.
            sample_indices=self._tensor(
                sample_indices + verify_indices + prompt_indices, torch.long
            ),
            lora=self._lora_batch(lora_slots.repeat_interleave(torch.tensor(counts))),
        )
        return batch, sampled

    def _prefill_attention(
        self, items: list[ScheduledSeq], tables: torch.Tensor
    ) -> PrefillAttention | None:
        if not items:
            return None
        starts = [0]
        for item in items:
            starts.append(starts[-1] + item.num_new_tokens)
        return PrefillAttention(
            block_tables=_trimmed(tables, items).to(self.device),
            seq_lens=self._tensor(
                [i.seq.num_computed_tokens + i.num_new_tokens for i in items], torch.int32
            ),
            query_start_loc=self._tensor(starts, torch.int32),
            num_tokens=starts[-1],
        )

    def _decode_attention(
        self, items: list[ScheduledSeq], tables: torch.Tensor
    ) -> DecodeAttention | None:
        if not items:
            return None
        return DecodeAttention(
            block_tables=_trimmed(tables, items).to(self.device),
            seq_lens=self._tensor([i.seq.num_computed_tokens + 1 for i in items], torch.int32),
        )

    def _lora_batch(self, lora_slots: torch.Tensor) -> LoRABatch | None:
        if self.adapter_slots is None or not bool((lora_slots >= 0).any()):
            return None
        slot_ids = lora_slots.to(self.device)
        return LoRABatch(
            weights=self.adapter_slots.slot_tensors,  # the step's slots, not the cache
            slot_ids=slot_ids,
            index=kernels.lora_index(slot_ids, self.adapter_slots.max_loras),
            rank=self.lora_rank(),
        )

    def _tensor(self, data, dtype) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)


def token_positions(starts: list[int], counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each new token's position, and the index of its sequence in the step: sequence i adds
    positions starts[i] ... starts[i] + counts[i] - 1."""
    counts_t = torch.tensor(counts, dtype=torch.long)
    rows = torch.repeat_interleave(torch.arange(len(counts)), counts_t)
    offsets = torch.cumsum(counts_t, 0) - counts_t  # where each sequence's tokens begin
    within = torch.arange(int(counts_t.sum())) - offsets[rows]
    return torch.tensor(starts, dtype=torch.long)[rows] + within, rows


def slot_mapping(
    tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Where each new token's K/V goes in the paged cache: its block's id times the block
    size, plus its offset in the block."""
    blocks = tables[rows, positions // block_size].to(torch.long)
    return blocks * block_size + positions % block_size


def _trimmed(tables: torch.Tensor, items: list[ScheduledSeq]) -> torch.Tensor:
    """The step's table rows of `items`, as wide as the longest of their tables."""
    width = max(len(item.seq.block_table) for item in items)
    return tables[:, :width]


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


def _with_forks(sampled: list[Sequence], logits: torch.Tensor, forks: list[ScheduledSeq]):
    """Each fork samples from its parent's logits row, right after it."""
    if not forks:
        return sampled, logits
    children: dict[int, list[Sequence]] = {}
    for item in forks:
        children.setdefault(item.parent.seq_id, []).append(item.seq)
    rows, expanded = [], []
    for i, seq in enumerate(sampled):
        for s in [seq, *children.get(seq.seq_id, ())]:
            rows.append(i)
            expanded.append(s)
    return expanded, logits[rows]


def _aligned_rank(rank: int, max_rank: int) -> int:
    """Round up to a multiple of 4 (zero padding) so LoRA matmuls keep 16-byte strides."""
    return min(max_rank, -(-rank // 4) * 4)

"""The draft-model proposer (vLLM's `method: "draft_model"`): a smaller model with the
target's vocabulary proposes each row's next tokens greedily, from its own paged KV cache.

Each row the draft has seen keeps its block table and the tokens its KV holds. A call
catches every row up (the tokens its KV lacks: the whole prompt the first time, then the
tokens the target accepted since, in one batched prefill pass), then decodes the rows'
proposals one position at a time, all rows batched. Proposal tokens are kept in the row's
KV; the next call keeps only the prefix the row's real tokens share with them (what the
target accepted), so rejected tokens' KV is simply written over. A row the scheduler no
longer asks about gives its blocks back; when blocks run out, the rows used longest ago
give theirs. Greedy proposals are deterministic, so the target's verification keeps its
exact distribution (engine/speculation/verify.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from loragate import kernels
from loragate.adapters import load_adapter
from loragate.adapters.pacing import UNPACED
from loragate.adapters.slots import DeviceSlots
from loragate.engine.loading.model_loader import load_config, load_weights, resolve_model
from loragate.engine.models import build_model
from loragate.engine.runner.forward_batch import (
    DecodeAttention,
    ForwardBatch,
    LoRABatch,
    PrefillAttention,
)
from loragate.engine.runner.kv_cache import KVCache
from loragate.engine.runner.model_runner import slot_mapping, token_positions

log = logging.getLogger(__name__)

BLOCK_SIZE = 16
# The draft's KV cache holds every running row's whole context, up to this many bytes (past
# it, rows used longest ago give their blocks back and are caught up again when asked).
MAX_KV_BYTES = 512 * 2**20
MAX_DRAFT_RANK = 256  # the highest rank a draft adapter may have


@dataclass
class DraftRow:
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # what the draft's KV holds, in order
    used: int = 0  # the call that last used it


class DraftModel:
    """`propose(rows, options)`, the proposer hook's form, over a draft model."""

    def __init__(
        self,
        model: str,
        *,
        target_vocab_size: int,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        max_num_seqs: int,
        weights_cache_dir: str | None = None,
        draft_adapters: dict[str, str] | None = None,
    ):
        """`draft_adapters`: adapter name -> a PEFT adapter trained on the draft model; a
        row of that adapter proposes with it (every other row with the plain draft)."""
        source = resolve_model(model, weights_cache_dir, gguf_blocks=True)
        config = load_config(source.hf_dir)
        self.model = build_model(config, device, dtype)
        if self.model.vocab_size != target_vocab_size:
            raise ValueError(
                f"speculative_config.model {model!r} has a vocabulary of "
                f"{self.model.vocab_size} tokens, the target's has {target_vocab_size}: a "
                "draft model must share the target's tokenizer"
            )
        self.model.load_weights(load_weights(source.hf_dir), max_model_len)
        num_blocks = _num_blocks(self.model, max_num_seqs, max_model_len)
        self.kv = KVCache.for_model(self.model, num_blocks, BLOCK_SIZE)
        self.free = list(range(num_blocks - 1, -1, -1))
        self.rows: dict[int, DraftRow] = {}
        self.calls = 0
        self.device = device
        self.slots, self.slot_of, self.rank = self._load_adapters(source.name, draft_adapters)
        log.info(
            "draft model: %s (%s), %d KV blocks", source.name, self.model.describe(), num_blocks
        )

    def propose(self, rows: list[dict], options: dict) -> list[list[int]]:
        self.calls += 1
        asked = {row["seq_id"] for row in rows}
        for seq_id in [s for s in self.rows if s not in asked]:
            self._drop(seq_id)
        active: list[tuple[int, dict, DraftRow]] = []
        for i, row in enumerate(rows):
            state = self.rows.setdefault(row["seq_id"], DraftRow())
            state.used = self.calls
            state.tokens = _common_prefix(state.tokens, row["token_ids"][:-1])
            need = len(row["token_ids"]) + row["max_tokens"] - 1
            if row["max_tokens"] > 0 and self._grow(state, need):
                active.append((i, row, state))
        proposals: list[list[int]] = [[] for _ in rows]
        if not active:
            return proposals
        next_ids = self._catch_up([(row, state) for _, row, state in active])
        for (i, row, state), token in zip(active, next_ids, strict=True):
            proposals[i].append(token)
            state.tokens = list(row["token_ids"])
        for _ in range(max(row["max_tokens"] for _, row, _ in active) - 1):
            going = [
                (i, row, state) for i, row, state in active if len(proposals[i]) < row["max_tokens"]
            ]
            if not going:
                break
            tokens = self._decode(
                [(state, proposals[i][-1]) for i, _, state in going], [row for _, row, _ in going]
            )
            for (i, _, state), token in zip(going, tokens, strict=True):
                state.tokens.append(proposals[i][-1])
                proposals[i].append(token)
        return proposals

    # ---- forwards -----------------------------------------------------------------------
    def _catch_up(self, rows: list[tuple[dict, DraftRow]]) -> list[int]:
        """Run each row's tokens its KV lacks (through its last token): the next token."""
        chunks = [(state, row["token_ids"][len(state.tokens) :]) for row, state in rows]
        starts = [len(state.tokens) for state, _ in chunks]
        counts = [len(chunk) for _, chunk in chunks]
        ids = [t for _, chunk in chunks for t in chunk]
        positions, rows_of = token_positions(starts, counts)
        tables = self._tables([state for state, _ in chunks])
        ends = torch.cumsum(torch.tensor(counts), 0)
        batch = ForwardBatch(
            input_ids=self._tensor(ids),
            positions=positions.to(self.device),
            slot_mapping=self._slots(tables, rows_of, positions),
            prefill=PrefillAttention(
                block_tables=tables.to(self.device),
                seq_lens=self._tensor(
                    [s + n for s, n in zip(starts, counts, strict=True)], torch.int32
                ),
                query_start_loc=self._tensor([0, *ends.tolist()], torch.int32),
                num_tokens=len(ids),
            ),
            decode=None,
            sample_indices=(ends - 1).to(self.device),
            lora=self._lora([row for row, _ in rows], counts),
        )
        return self._greedy(batch)

    def _decode(self, rows: list[tuple[DraftRow, int]], asked: list[dict]) -> list[int]:
        """One token each: the last proposed token runs at the position after the row's KV."""
        positions = torch.tensor([len(state.tokens) for state, _ in rows])
        tables = self._tables([state for state, _ in rows])
        batch = ForwardBatch(
            input_ids=self._tensor([token for _, token in rows]),
            positions=positions.to(self.device),
            slot_mapping=self._slots(tables, torch.arange(len(rows)), positions),
            prefill=None,
            decode=DecodeAttention(
                block_tables=tables.to(self.device),
                seq_lens=(positions + 1).to(torch.int32).to(self.device),
            ),
            sample_indices=torch.arange(len(rows), device=self.device),
            lora=self._lora(asked, [1] * len(rows)),
        )
        return self._greedy(batch)

    def _greedy(self, batch: ForwardBatch) -> list[int]:
        hidden = self.model.forward(batch, self.kv)
        return self.model.compute_logits(hidden, batch).max(dim=-1).indices.tolist()

    # ---- draft adapters -----------------------------------------------------------------
    def _load_adapters(self, model_name: str, paths: dict[str, str] | None):
        """Each draft adapter in a slot of its own, all resident: (slots, name -> slot,
        the rank the LoRA kernels run at); (None, {}, 0) without any."""
        if not paths:
            return None, {}, 0
        spec = self.model.lora_spec(model_name)
        loaded = {
            name: load_adapter(
                path, spec, MAX_DRAFT_RANK, pacing=UNPACED, stack_dtype=self.model.dtype
            )
            for name, path in paths.items()
        }
        rank = -(-max(adapter.rank for adapter in loaded.values()) // 4) * 4  # as the runner
        slots = DeviceSlots(spec, len(loaded), rank, self.device, self.model.dtype)
        slot_of = {}
        for slot, (name, adapter) in enumerate(loaded.items()):
            slots.write(slot, adapter)
            slot_of[name] = slot
        log.info("draft adapters: %s", ", ".join(sorted(slot_of)))
        return slots, slot_of, rank

    def _lora(self, rows: list[dict], counts: list[int]) -> LoRABatch | None:
        """The rows' draft adapters, token by token (-1: the plain draft)."""
        if self.slots is None:
            return None
        per_row = [self.slot_of.get(row["lora_name"], -1) for row in rows]
        if max(per_row) < 0:
            return None
        slot_ids = torch.repeat_interleave(torch.tensor(per_row), torch.tensor(counts))
        slot_ids = slot_ids.to(self.device)
        return LoRABatch(
            weights=self.slots,
            slot_ids=slot_ids,
            index=kernels.lora_index(slot_ids, self.slots.max_loras),
            rank=self.rank,
        )

    # ---- blocks -------------------------------------------------------------------------
    def _grow(self, state: DraftRow, num_tokens: int) -> bool:
        """Blocks for `num_tokens` positions, taking them from the rows used longest ago
        when none are free; False (no proposal this call) when even that is not enough."""
        need = -(-num_tokens // BLOCK_SIZE) - len(state.blocks)
        while need > len(self.free):
            idle = [s for s, r in self.rows.items() if r.used < self.calls and r.blocks]
            if not idle:
                return False
            self._drop(min(idle, key=lambda s: self.rows[s].used))
        for _ in range(max(need, 0)):
            state.blocks.append(self.free.pop())
        return True

    def _drop(self, seq_id: int) -> None:
        state = self.rows.pop(seq_id)
        self.free += reversed(state.blocks)

    def _tables(self, states: list[DraftRow]) -> torch.Tensor:
        width = max(len(state.blocks) for state in states)
        tables = torch.zeros(len(states), width, dtype=torch.int32)
        for i, state in enumerate(states):
            tables[i, : len(state.blocks)] = torch.tensor(state.blocks, dtype=torch.int32)
        return tables

    def _slots(self, tables, rows, positions) -> torch.Tensor:
        return slot_mapping(tables, rows, positions, BLOCK_SIZE).to(self.device)

    def _tensor(self, data, dtype=torch.long) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)


def _num_blocks(model, max_num_seqs: int, max_model_len: int) -> int:
    per_block = 2 * model.num_layers * BLOCK_SIZE * model.num_kv_heads * model.head_dim
    per_block *= torch.empty((), dtype=model.dtype).element_size()
    wanted = max_num_seqs * -(-max_model_len // BLOCK_SIZE)
    return max(-(-max_model_len // BLOCK_SIZE), min(wanted, MAX_KV_BYTES // per_block))


def _common_prefix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]

"""Each row's token counts for penalties, kept beside the persistent batch's sampling rows.

Penalties read, per row, which tokens its prompt holds (repetition) and how often each token
occurs in its output (presence, frequency). Counting them from the sequence's lists every
step costs a pass over its whole history and a vocabulary-sized scatter per row; here they
persist, as vLLM V1's model runner keeps a prompt mask and output bin counts per request:

- a row's counts are built from its history the first time it is sampled with penalties
  (after it took the row: a prompt admitted, a fork, a swap-in, a recompute after
  preemption), since a sequence joins before its first token is sampled;
- each later step adds only the tokens appended to its output since (normally one);
- they are forgotten when its sequence leaves the row (`SamplingBatch.clear`), so the next
  sequence to take the row builds its own. A history shorter than what was counted (tokens
  cut off) is rebuilt too.

Layout: dense ``[rows, vocab]`` tables, int32 output counts and a bool prompt mask (64 rows
x 49152 tokens: 12 + 3 MB), allocated at the first penalised row, on the logits' device. A
step gathers its penalised rows with one index, the form ``apply_penalties`` takes, and an
update is one indexed add; a sparse layout would save memory only to rebuild the dense rows
every step. Rows without penalties are never written; their rows of the table stay zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import torch

NOT_BUILT = -1


class PenaltyCounts:
    """Prompt masks and output counts, one row per persistent-batch row."""

    def __init__(self, num_rows: int):
        self.prompt_mask: torch.Tensor | None = None  # [rows, vocab] bool
        self.output_counts: torch.Tensor | None = None  # [rows, vocab] int32
        # Per row, how many output tokens its counts hold (NOT_BUILT: nothing yet).
        self.counted = [NOT_BUILT] * num_rows

    @property
    def num_rows(self) -> int:
        return len(self.counted)

    def forget(self, row: int) -> None:
        """The row's sequence left: its counts are stale and rebuilt by the next one."""
        self.counted[row] = NOT_BUILT

    def grow(self, num_rows: int) -> None:
        """At least `num_rows` rows, the old ones kept."""
        old = self.num_rows
        if num_rows <= old:
            return
        self.counted += [NOT_BUILT] * (num_rows - old)
        if self.output_counts is not None:
            self.prompt_mask = _grown(self.prompt_mask, num_rows)
            self.output_counts = _grown(self.output_counts, num_rows)

    def gather(
        self,
        rows: Sequence[int],
        histories: Sequence,
        with_prompt: Sequence[bool],
        vocab_size: int,
        device: torch.device | str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``' prompt masks and output counts, brought up to date with `histories`
        (each a TokenHistory); a row's prompt counts only where `with_prompt` says so."""
        self._allocate(vocab_size, torch.device(device))
        rebuilt, prompts, outputs, counted = [], [], [], []
        for row, history, prompt in zip(rows, histories, with_prompt, strict=True):
            output = history.output_token_ids
            done = self.counted[row]
            if done == NOT_BUILT or len(output) < done:
                rebuilt.append(row)
                prompts.append(history.prompt_token_ids if prompt else [])
                done = 0
            else:
                prompts.append([])
            outputs.append(output[done:])
            counted.append(len(output))
        device = self.output_counts.device
        # Both checked before anything is written: a bad id leaves every row as it was.
        prompt_index = _flat(rows, prompts, vocab_size, device)
        output_index = _flat(rows, outputs, vocab_size, device)
        if rebuilt:
            index = torch.tensor(rebuilt, device=device)
            self.prompt_mask.index_fill_(0, index, False)
            self.output_counts.index_fill_(0, index, 0)
        if prompt_index[1].numel():
            trues = torch.ones(prompt_index[1].numel(), dtype=torch.bool, device=device)
            self.prompt_mask.index_put_(prompt_index, trues)
        if output_index[1].numel():
            ones = torch.ones(output_index[1].numel(), dtype=torch.int32, device=device)
            self.output_counts.index_put_(output_index, ones, accumulate=True)
        for row, n in zip(rows, counted, strict=True):
            self.counted[row] = n
        index = torch.tensor(list(rows), device=device)
        return self.prompt_mask.index_select(0, index), self.output_counts.index_select(0, index)

    def _allocate(self, vocab_size: int, device: torch.device) -> None:
        if self.output_counts is not None:
            if self.output_counts.shape[1] != vocab_size:
                raise ValueError(
                    f"penalty counts hold {self.output_counts.shape[1]} tokens, not {vocab_size}"
                )
            return
        self.prompt_mask = torch.zeros(self.num_rows, vocab_size, dtype=torch.bool, device=device)
        self.output_counts = torch.zeros(
            self.num_rows, vocab_size, dtype=torch.int32, device=device
        )


def _flat(
    rows: Sequence[int], token_ids: Sequence[Sequence[int]], vocab_size: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index pairs of each row's ids, checked against the vocabulary."""
    lengths = [len(ids) for ids in token_ids]
    flat = torch.tensor(list(chain.from_iterable(token_ids)), dtype=torch.long)
    if flat.numel():
        low, high = int(flat.min()), int(flat.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    index = torch.repeat_interleave(torch.tensor(list(rows)), torch.tensor(lengths))
    return index.to(device), flat.to(device)


def _grown(table: torch.Tensor, num_rows: int) -> torch.Tensor:
    grown = torch.zeros(num_rows, table.shape[1], dtype=table.dtype, device=table.device)
    grown[: table.shape[0]] = table
    return grown

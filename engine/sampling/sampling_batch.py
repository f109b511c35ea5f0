"""Per-row sampling parameters as tensors, kept beside the persistent batch (issue 36).

A sequence's sampling parameters are written into its row once, when it takes a row of the
persistent batch (engine/runner/input_batch.py), and cleared when it leaves it. A step's sampler
reads its rows as one index into these columns (`StepRows`) instead of rebuilding a tensor
from every row's SamplingParams each step, as vLLM V1's InputBatch keeps temperature, top-p
and top-k per request. A count of the live rows that need more than the raw argmax lets an
all-greedy batch skip even that index.

A cleared row is all zeros, with no parameters and no generator. Penalised rows also keep
their token counts here (engine/sampling/penalty_counts.py), forgotten when the row is cleared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from loragate.engine.sampling.penalty_counts import PenaltyCounts
from loragate.engine.sampling.sampling_params import SamplingParams

# The columns, each one value per row, and the dtype the sampler's tensor functions take.
COLUMNS: dict[str, torch.dtype] = {
    "temperature": torch.float32,
    "top_p": torch.float32,
    "top_k": torch.long,
    "min_p": torch.float32,
    "presence_penalty": torch.float32,
    "frequency_penalty": torch.float32,
    "repetition_penalty": torch.float32,
    "min_tokens": torch.long,
    "greedy": torch.bool,
    "penalised": torch.bool,
    "scored": torch.bool,
    "seeded": torch.bool,  # the row draws from its own generator
}


def row_values(params: SamplingParams, generator: torch.Generator | None) -> dict:
    """What a row holds for these parameters, one value per column."""
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "min_p": params.min_p,
        "presence_penalty": params.presence_penalty,
        "frequency_penalty": params.frequency_penalty,
        "repetition_penalty": params.repetition_penalty,
        "min_tokens": params.min_tokens,
        "greedy": params.greedy,
        "penalised": params.has_penalties,
        "scored": params.scores_tokens,
        "seeded": generator is not None,
    }


def needs_more_than_argmax(params: SamplingParams) -> bool:
    """A row the greedy fast path cannot take: random, penalised, scored or min_tokens."""
    return (
        not params.greedy or params.has_penalties or params.scores_tokens or params.min_tokens > 0
    )


class SamplingBatch:
    """One row of sampling parameters per persistent-batch row, as preallocated tensors."""

    def __init__(self, max_rows: int):
        self.columns: dict[str, torch.Tensor] = {}
        self._views: dict = {}  # numpy views: a row is written without a tensor per value
        self.params: list[SamplingParams | None] = []
        self.generators: list[torch.Generator | None] = []
        self.num_special = 0  # live rows that need more than the raw argmax
        self.num_plugin_sampled = 0  # live rows sampled by a plugin's sampler
        self.counts = PenaltyCounts(0)
        self.grow(max_rows)

    @property
    def num_rows(self) -> int:
        return len(self.params)

    def write(self, row: int, params: SamplingParams, generator: torch.Generator | None) -> None:
        """The sequence that takes `row` samples with `params` (and its own generator)."""
        self.clear(row)
        for name, value in row_values(params, generator).items():
            self._views[name][row] = value
        self.params[row] = params
        self.generators[row] = generator
        self.num_special += needs_more_than_argmax(params)
        self.num_plugin_sampled += params.sampler is not None

    def clear(self, row: int) -> None:
        """The row's sequence left: the row holds nothing again."""
        self.counts.forget(row)
        params = self.params[row]
        if params is None:
            return
        self.num_special -= needs_more_than_argmax(params)
        self.num_plugin_sampled -= params.sampler is not None
        for view in self._views.values():
            view[row] = 0
        self.params[row] = None
        self.generators[row] = None

    def grow(self, num_rows: int) -> None:
        """At least `num_rows` rows, the old ones kept."""
        old = self.num_rows
        if num_rows <= old:
            return
        for name, dtype in COLUMNS.items():
            grown = torch.zeros(num_rows, dtype=dtype)
            if old:
                grown[:old] = self.columns[name]
            self.columns[name] = grown
            self._views[name] = grown.numpy()
        self.params += [None] * (num_rows - old)
        self.generators += [None] * (num_rows - old)
        self.counts.grow(num_rows)


class TokenHistory(Protocol):
    """What penalties and min_tokens read of a row: a Sequence, or a SamplingRow."""

    @property
    def prompt_token_ids(self) -> list[int]: ...

    @property
    def output_token_ids(self) -> list[int]: ...


@dataclass
class SamplingRow:
    """One sequence to sample for; generator None means the sampler's shared one."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None


class StepRows:
    """The rows one step samples, in the order of its logits: an index into a SamplingBatch,
    and each row's token history (read only for penalties and min_tokens)."""

    def __init__(
        self,
        batch: SamplingBatch,
        rows: list[int],
        histories: Sequence[TokenHistory],
        index: torch.Tensor | None = None,
    ):
        self.batch = batch
        self.rows = rows
        self.histories = histories
        self.index = torch.tensor(rows, dtype=torch.long) if index is None else index
        self._columns: dict[str, torch.Tensor] = {}

    @classmethod
    def from_rows(cls, rows: Sequence[SamplingRow]) -> StepRows:
        """A batch rebuilt from scratch for these rows, row i for rows[i]."""
        batch = SamplingBatch(len(rows))
        for i, row in enumerate(rows):
            batch.write(i, row.params, row.generator)
        return cls(batch, list(range(len(rows))), list(rows))

    def column(self, name: str) -> torch.Tensor:
        """The column's values of these rows, in order (gathered once per step)."""
        values = self._columns.get(name)
        if values is None:
            values = self.batch.columns[name].index_select(0, self.index)
            self._columns[name] = values
        return values

    def select(self, positions: torch.Tensor) -> StepRows:
        """The rows at these positions (a 1-d long tensor), in that order."""
        if positions.numel() == len(self.rows):
            return self
        at = positions.tolist()
        part = StepRows(
            self.batch,
            [self.rows[i] for i in at],
            [self.histories[i] for i in at],
            self.index[positions],
        )
        part._columns = {name: values[positions] for name, values in self._columns.items()}
        return part

    def chunk(self, start: int, stop: int) -> StepRows:
        """Rows start..stop-1, their gathered columns shared as views."""
        if start == 0 and stop >= len(self.rows):
            return self
        part = StepRows(
            self.batch, self.rows[start:stop], self.histories[start:stop], self.index[start:stop]
        )
        part._columns = {name: values[start:stop] for name, values in self._columns.items()}
        return part

    def params(self, i: int) -> SamplingParams:
        return self.batch.params[self.rows[i]]

    def penalty_counts(
        self, positions: list[int], vocab_size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt masks (only where repetition_penalty applies) and output counts of
        the rows at these positions, as ``[len(positions), vocab]`` tensors, brought up to
        date with their histories in the batch's persistent counts."""
        return self.batch.counts.gather(
            [self.rows[i] for i in positions],
            [self.histories[i] for i in positions],
            [self.params(i).repetition_penalty != 1.0 for i in positions],
            vocab_size,
            device,
        )

    def generators(self) -> list[torch.Generator | None]:
        return [self.batch.generators[row] for row in self.rows]

    def all_plain_greedy(self) -> bool:
        """Every row takes the raw argmax: greedy, no penalties, not scored, and past its
        min_tokens. Without such a row in the whole batch, no tensor is read at all."""
        if self.batch.num_special == 0:
            return True
        if not bool(self.column("greedy").all()):
            return False
        if bool(self.column("penalised").any()) or bool(self.column("scored").any()):
            return False
        return not self.below_min_tokens()

    def below_min_tokens(self) -> list[int]:
        """Positions of the rows that have not yet reached their min_tokens."""
        if self.batch.num_special == 0:
            return []
        wanted = self.column("min_tokens")
        asked = wanted.nonzero().squeeze(1).tolist()
        return [i for i in asked if len(self.histories[i].output_token_ids) < int(wanted[i])]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> SamplingRow:
        history, row = self.histories[i], self.rows[i]
        return SamplingRow(
            self.batch.params[row],
            history.prompt_token_ids,
            history.output_token_ids,
            self.batch.generators[row],
        )

    def __iter__(self) -> Iterator[SamplingRow]:
        return (self[i] for i in range(len(self.rows)))

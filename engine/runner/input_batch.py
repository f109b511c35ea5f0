"""The persistent batch: each sequence's block table lives in one row of a preallocated
tensor, written only when that table changes (vLLM V1's InputBatch is the model).

A sequence takes a row the first time its blocks are set (a prompt admitted, a swap-in, a
fork), keeps it while it runs, and gives it back when its blocks are freed (finished,
aborted, preempted). The block manager logs every table it changes (a new block, a copy on
write, a prefix hit taken, a free, a fork, a swap-in), the scheduler hands the log to the
runner in its SchedulerOutput, and the runner (this batch's only user) `sync`s exactly
those rows before the step's inputs are cut from the tensor, so a step costs no
per-sequence table rebuild, and a row is never read for a sequence that left it.

Beside the tables, each row holds its sequence's sampling parameters
(engine/sampling/sampling_batch.py): written when the sequence takes the row, cleared when it
leaves.
"""

from __future__ import annotations

import torch

from loragate.engine.core.sequence import Sequence
from loragate.engine.sampling.sampling_batch import SamplingBatch


class InputBatch:
    def __init__(self, max_rows: int, max_blocks_per_seq: int):
        self.max_blocks_per_seq = max_blocks_per_seq
        # Rows of the block tables, padded with 0 past each table's length (as a rebuild
        # pads). A numpy view writes a row from a Python list without a tensor per row.
        self.block_tables = torch.zeros(max_rows, max_blocks_per_seq, dtype=torch.int32)
        self._rows_np = self.block_tables.numpy()
        self.num_blocks = [0] * max_rows
        self.sampling = SamplingBatch(max_rows)
        self.row_of: dict[int, int] = {}  # seq_id -> row
        self._free_rows = list(range(max_rows - 1, -1, -1))  # pop() gives the lowest

    @property
    def num_rows(self) -> int:
        return self.block_tables.shape[0]

    def sync(self, changed: dict[int, Sequence]) -> None:
        """Rewrite the rows of the sequences whose block tables changed: a sequence with
        blocks gets (or keeps) a row holding its table; one without leaves its row."""
        for seq_id, seq in changed.items():
            row = self.row_of.get(seq_id)
            table = seq.block_table
            if not table:
                if row is not None:
                    self._clear(row)
                    self.sampling.clear(row)
                    del self.row_of[seq_id]
                    self._free_rows.append(row)
                continue
            if row is None:
                row = self._take_row()
                self.row_of[seq_id] = row
                self.sampling.write(row, seq.request.params, seq.generator)
            self._write(row, table)

    def tables(self, seqs: list[Sequence]) -> torch.Tensor:
        """[len(seqs), widest table] int32: the rows of `seqs`, in that order."""
        rows = [self.row_of[seq.seq_id] for seq in seqs]
        width = max(self.num_blocks[row] for row in rows)
        index = torch.tensor(rows, dtype=torch.long)
        return self.block_tables[:, :width].index_select(0, index)

    def _write(self, row: int, table: list[int]) -> None:
        n = len(table)
        if n > self.max_blocks_per_seq:
            raise ValueError(f"a block table of {n} blocks exceeds {self.max_blocks_per_seq}")
        self._rows_np[row, :n] = table
        if self.num_blocks[row] > n:
            self._rows_np[row, n : self.num_blocks[row]] = 0
        self.num_blocks[row] = n

    def _clear(self, row: int) -> None:
        self._rows_np[row, : self.num_blocks[row]] = 0
        self.num_blocks[row] = 0

    def _take_row(self) -> int:
        if not self._free_rows:
            self._grow()
        return self._free_rows.pop()

    def _grow(self) -> None:
        """Twice the rows: forks of n > 1 and beam search may outnumber max_num_seqs."""
        old = self.num_rows
        grown = torch.zeros(2 * old, self.max_blocks_per_seq, dtype=torch.int32)
        grown[:old] = self.block_tables
        self.block_tables = grown
        self._rows_np = grown.numpy()
        self.num_blocks += [0] * old
        self.sampling.grow(2 * old)
        self._free_rows = list(range(2 * old - 1, old - 1, -1)) + self._free_rows

"""Constrained decoding in one call per step: one bitmask for every constrained row.

A grammar processor (the structured-output plugin's) fills its row of the step's shared
int32 bitmask (bit i of word w allows token 32w + i, llguidance's layout) from its matcher;
then one kernel call sets every forbidden token of every constrained row to -inf, in place
in the step's logits. Rows no processor touches are neither read nor copied.
"""

from __future__ import annotations

import torch

from loragate import kernels
from loragate.plugins import PluginError
from loragate.plugins.answers import callable_name


class GrammarMasks:
    """The step's bitmask (grown to the most constrained rows seen, then reused)."""

    def __init__(self) -> None:
        self._words = torch.empty((0, 0), dtype=torch.int32)

    def apply_(
        self, seqs, rows: list[int], logits: torch.Tensor, results: list, histories=None
    ) -> None:
        """Mask `logits`' rows `rows` (each sequence's single processor has
        `fill_bitmask`); a processor that fails leaves its row alone and its error in
        results[row]. `histories` (default: the sequences) give each row's tokens so far."""
        histories = seqs if histories is None else histories
        width = (logits.shape[1] + 31) // 32
        if self._words.shape[0] < len(rows) or self._words.shape[1] != width:
            self._words = torch.empty((max(len(rows), 8), width), dtype=torch.int32)
        filled: list[int] = []
        for row in rows:
            seq = seqs[row]
            plugin_name, processor = seq.request.logits_processors[0]
            try:
                processor.fill_bitmask(histories[row].output_token_ids, self._words, len(filled))
            except Exception as exc:
                where = f"logits processor {callable_name(processor)} of plugin {plugin_name!r}"
                results[row] = PluginError(
                    plugin_name, f"{where} raised {type(exc).__name__}: {exc}"
                )
                continue
            filled.append(row)
        if filled:
            index = torch.tensor(filled, dtype=torch.int64)
            kernels.apply_token_masks_(logits, self._words[: len(filled)], index)

"""Which sampler each sequence uses: the built-in one, or a plugin's by name.

A failure becomes that sequence's result (a PluginError for a plugin, the exception
itself for the built-in sampler), so only its request fails and the rest of the batch
goes on. The built-in sampler reads each sequence's parameters from its row of the
persistent batch (engine/sampling/sampling_batch.py), written when the sequence took that row.
"""

from __future__ import annotations

import torch

from loragate.engine.core.sequence import Sequence
from loragate.engine.runner.input_batch import InputBatch
from loragate.engine.sampling.grammar_masks import GrammarMasks
from loragate.engine.sampling.sampler import Sampler, SampleResult
from loragate.engine.sampling.sampling_batch import SamplingRow, StepRows
from loragate.plugins import PluginError, PluginManager


class SampleDispatcher:
    def __init__(
        self, sampler: Sampler, plugins: PluginManager, input_batch: InputBatch | None = None
    ):
        self.sampler = sampler
        self.plugins = plugins
        # Whose rows hold each sequence's sampling parameters; without one, every step
        # builds them from the sequences' SamplingParams.
        self.input_batch = input_batch
        self.grammar_masks = GrammarMasks()

    def apply_logits_processors(
        self,
        seqs: list[Sequence],
        logits,
        results: list,
        in_place: bool = False,
        histories: list | None = None,
    ) -> torch.Tensor:
        """Each request's plugin processors; a failure is stored in results[i]. With
        `in_place` they work on the rows of `logits` itself (nobody needs the raw values
        after them); otherwise on a copy. Rows whose only processor is a grammar mask (it
        has `fill_bitmask`) share one bitmask, applied to all of them in one call.
        `histories` (default: the sequences themselves) give each row's tokens so far."""
        histories = seqs if histories is None else histories
        if not any(s.request.logits_processors for s in seqs):
            return logits
        if not in_place:
            logits = logits.clone()  # processors may change their rows in place
        masked: list[int] = []
        for i, seq in enumerate(seqs):
            processors = seq.request.logits_processors
            if not processors:
                continue
            if len(processors) == 1 and hasattr(processors[0].fn, "fill_bitmask"):
                masked.append(i)
                continue
            row = logits[i]
            try:
                result = self.plugins.apply_logits_processors(
                    processors, histories[i].output_token_ids, row
                )
            except PluginError as exc:
                results[i] = exc
                continue
            if result.data_ptr() != row.data_ptr():
                row.copy_(result)
        if masked:
            self.grammar_masks.apply_(seqs, masked, logits, results, histories)
        return logits

    def sample(
        self, seqs: list[Sequence], logits: torch.Tensor, histories: list | None = None
    ) -> list:
        """One SampleResult (or the exception that failed it) per sequence. `histories`
        (default: the sequences) give each row's tokens so far, which processors, penalties
        and min_tokens read: speculative verification extends them by accepted tokens."""
        histories = seqs if histories is None else histories
        results: list = [None] * len(seqs)
        # Plugin samplers report logprobs of the raw logits: a row that has both keeps them
        # unmasked in a copy. Otherwise processors mask the step's own logits in place (no
        # vocabulary-sized copy per step; rows no processor touches are not copied at all).
        plugin_sampled = self._any_plugin_sampler(seqs)
        raw_needed = plugin_sampled and any(
            seq.request.params.sampler is not None and seq.request.logits_processors for seq in seqs
        )
        processed = self.apply_logits_processors(
            seqs, logits, results, in_place=not raw_needed, histories=histories
        )
        if not plugin_sampled and results.count(None) == len(results):
            # The usual step: every row is the built-in sampler's, no per-row grouping.
            self._builtin_sample(seqs, histories, list(range(len(seqs))), processed, results)
            return results
        by_sampler: dict[str | None, list[int]] = {}
        for i, seq in enumerate(seqs):
            if results[i] is None:
                by_sampler.setdefault(seq.request.params.sampler, []).append(i)
        for name, idx in by_sampler.items():
            if name is None:
                self._builtin_sample(seqs, histories, idx, processed, results)
            else:
                self._plugin_sample(name, seqs, histories, idx, logits, processed, results)
        return results

    def _builtin_sample(self, seqs, histories, idx, processed, results) -> None:
        rows = self._step_rows([seqs[i] for i in idx], [histories[i] for i in idx])
        # Every row, in order (the usual step): the logits themselves, not a copy of them.
        chosen = processed if len(idx) == processed.shape[0] else processed[idx]
        try:
            sampled = self.sampler(chosen, rows)
        except Exception:
            # One row's values may be what broke it: row by row, so only that one fails.
            for i, row in zip(idx, list(rows), strict=True):
                try:
                    results[i] = self.sampler(processed[i : i + 1], [row])[0]
                except Exception as exc:
                    results[i] = exc
            return
        for i, result in zip(idx, sampled, strict=True):
            results[i] = result

    def _any_plugin_sampler(self, seqs: list[Sequence]) -> bool:
        """Whether a row may name a plugin's sampler: no row of the batch does, usually."""
        if self.input_batch is None:
            return any(seq.request.params.sampler is not None for seq in seqs)
        return self.input_batch.sampling.num_plugin_sampled > 0

    def _step_rows(self, seqs: list[Sequence], histories: list) -> StepRows:
        """The sequences' rows of the persistent batch's sampling columns, in order."""
        if self.input_batch is None:
            return StepRows.from_rows([_row(s, h) for s, h in zip(seqs, histories, strict=True)])
        row_of = self.input_batch.row_of
        rows = [row_of[seq.seq_id] for seq in seqs]
        return StepRows(self.input_batch.sampling, rows, histories)

    def _plugin_sample(self, name, seqs, histories, idx, raw, processed, results) -> None:
        args = [_sampler_args(seqs[i], histories[i]) for i in idx]
        try:
            tokens = self.plugins.call_sampler(name, processed[idx], args).tolist()
        except PluginError as exc:
            if len(idx) == 1:
                results[idx[0]] = exc
                return
            # One row's input may be what broke it: retry row by row so only that one fails.
            for i, row_args in zip(idx, args, strict=True):
                self._plugin_sample_one(name, seqs[i], i, raw, processed, row_args, results)
            return
        logprobs = torch.log_softmax(raw[idx].float(), dim=-1)
        for row, (i, token) in enumerate(zip(idx, tokens, strict=True)):
            results[i] = _result(token, logprobs[row], seqs[i].request.params.logprobs)

    def _plugin_sample_one(self, name, seq, i, raw, processed, args, results) -> None:
        try:
            token = self.plugins.call_sampler(name, processed[i : i + 1], [args]).item()
        except PluginError as exc:
            results[i] = exc
            return
        logprobs = torch.log_softmax(raw[i].float(), dim=-1)
        results[i] = _result(token, logprobs, seq.request.params.logprobs)


def _sampler_args(seq: Sequence, history) -> dict:
    """The request's sampler_args, plus `step` (tokens generated so far) for stateless
    seeded samplers."""
    args = dict(seq.request.params.sampler_args or {})
    args.setdefault("step", len(history.output_token_ids))
    return args


def _row(seq: Sequence, history) -> SamplingRow:
    request = seq.request
    return SamplingRow(
        request.params, request.prompt_token_ids, history.output_token_ids, seq.generator
    )


def _result(token: int, logprobs: torch.Tensor, top_n: int | None) -> SampleResult:
    """Raw logprobs for a plugin-chosen token, shaped as the built-in sampler's."""
    top = None
    if top_n is not None:
        values, ids = logprobs.topk(top_n)
        top = dict(zip(ids.tolist(), values.tolist(), strict=True))
        top[token] = logprobs[token].item()
    return SampleResult(token, logprobs[token].item(), top)

"""Drives a decoding strategy (beam search by default) over a request's sequences.

The strategy chooses; this module does the bookkeeping: the runner computes each running
beam's log-probs (`beam_logprobs`), which are kept until every beam of the group has them
(a preempted beam may lag a step); then the strategy's decision goes through the
scheduler, which forks parents (sharing KV blocks, copy-on-write), appends the chosen
tokens and frees the beams no one continues.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from loragate.engine.core.sequence import Request, Sequence
from loragate.plugins import PluginError


class BeamGroup:
    """The strategy, its state and the running beams, in the order the strategy sees them."""

    def __init__(self, strategy, state, first: Sequence, plugin_name: str = "beam"):
        self.strategy = strategy
        self.plugin_name = plugin_name
        self.state = state
        self.beams: list[Sequence] = [first]
        self.done = False
        self.results: list = []


def start(request: Request, plugins, eos_token_ids: set[int], max_tokens: int) -> None:
    """Begin a beam search with the plugin that provides it; its failure names the plugin
    (a ValueError about the request stays one)."""
    params = request.params
    plugin_name, strategy = plugins.decoding_strategy("beam")
    eos = set() if params.ignore_eos else set(eos_token_ids)
    try:
        state = strategy.start(asdict(params), eos, max_tokens)
    except ValueError:
        raise
    except Exception as exc:
        raise strategy_error(exc, plugin_name) from exc
    request.beam = BeamGroup(strategy, state, request.seqs[0], plugin_name)


def beam_logprobs(seqs: list[Sequence], logits: torch.Tensor, apply_logits_processors):
    """Each beam row's log-probs after its request's logits processors and beam temperature
    (the runner's part); a processor's failure stands in its row."""
    errors: list = [None] * len(seqs)
    processed = apply_logits_processors(seqs, logits, errors)
    temperatures = [s.request.params.beam_temperature for s in seqs]
    if any(t != 1.0 for t in temperatures):  # scores as vLLM's LLM.beam_search scales them
        scale = torch.tensor(temperatures, device=processed.device)
        processed = processed.float() / scale[:, None]
    logprobs = torch.log_softmax(processed.float(), dim=-1)
    return [e if e is not None else row for row, e in zip(logprobs, errors, strict=True)]


class BeamSearchDriver:
    """The scheduler's part: each beam's log-probs wait for its group, whose strategy then
    decides; the scheduler applies the decision (engine/core/scheduler.py)."""

    def __init__(self, scheduler, new_sequence: Callable[[Request, int], Sequence]):
        self.scheduler = scheduler
        self.new_sequence = new_sequence

    def step(self, beams: list[tuple[Sequence, torch.Tensor | Exception]], touched: dict):
        """Take each beam row's log-probs (or the error that failed its request), then step
        every group whose beams all have theirs."""
        for seq, row in beams:
            if isinstance(row, Exception):
                self.scheduler.fail(seq.request, row)
                touched[seq.request.request_id] = seq.request
            elif not seq.finished:
                seq.beam_logprobs = row
        for request in {s.request.request_id: s.request for s, _ in beams}.values():
            if request.finished:
                continue
            try:
                if self.step_if_ready(request):
                    touched[request.request_id] = request
            except Exception as exc:  # the strategy failed this group alone
                self.scheduler.fail(request, strategy_error(exc, request.beam.plugin_name))
                touched[request.request_id] = request

    def step_if_ready(self, request: Request) -> bool:
        """Advance the group once every running beam has its log-probs; True when done."""
        group: BeamGroup = request.beam
        if any(b.beam_logprobs is None for b in group.beams):
            return False
        logprobs = torch.stack([b.beam_logprobs for b in group.beams])
        for b in group.beams:
            b.beam_logprobs = None
        decision = group.strategy.step(group.state, logprobs)
        self._apply(request, group, decision.parents, decision.tokens)
        if decision.done:
            group.done = True
            group.results = group.strategy.finish(group.state)
            for beam in group.beams:
                self.scheduler.finish(beam, "stop")
            group.beams = []
        return group.done

    def _apply(self, request: Request, group: BeamGroup, parents, tokens) -> None:
        old = group.beams
        taken: set[int] = set()
        new: list[Sequence] = []
        for p in parents:  # fork first: children copy the parent before it grows
            parent = old[p]
            if p in taken:
                child = self.new_sequence(request, len(request.seqs))
                request.seqs.append(child)
                self.scheduler.fork(parent, child)
                new.append(child)
            else:
                taken.add(p)
                new.append(parent)
        for seq, token in zip(new, tokens, strict=True):
            self.scheduler.append_token(seq, token)
        for p, beam in enumerate(old):
            if p not in taken:
                self.scheduler.finish(beam, "stop")
        group.beams = new


def strategy_error(exc: Exception, plugin_name: str) -> PluginError:
    """A decoding strategy (beam search included) is a plugin: its failure names it."""
    return PluginError(
        plugin_name,
        f"decoding strategy of plugin {plugin_name!r} raised {type(exc).__name__}: {exc}",
    )

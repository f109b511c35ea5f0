"""Drives a decoding strategy (beam search by default) over a request's sequences.

The strategy chooses; this module does the bookkeeping: each running beam's log-probs are
kept until every beam of the group has them (a preempted beam may lag a step), then the
strategy's decision forks parents (sharing KV blocks, copy-on-write) and frees the beams
no one continues.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

import torch

from loragate.engine.block_manager import BlockManager
from loragate.engine.scheduler import Scheduler
from loragate.engine.sequence import Request, Sequence, SequenceStatus
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


class BeamSearchDriver:
    def __init__(
        self,
        scheduler: Scheduler,
        block_manager: BlockManager,
        new_sequence: Callable[[Request, int], Sequence],
        finish: Callable[[Sequence, str], None],
        apply_logits_processors: Callable,
        fail: Callable[[Request, Exception], None],
    ):
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.new_sequence = new_sequence
        self.finish = finish
        self.apply_logits_processors = apply_logits_processors
        self.fail = fail

    def step(self, sampled: list[Sequence], logits: torch.Tensor, touched: dict):
        """Beam groups take their log-probs here; the rest goes on to the sampler."""
        beam_rows = [i for i, s in enumerate(sampled) if s.request.beam is not None]
        if not beam_rows:
            return sampled, logits
        seqs = [sampled[i] for i in beam_rows]
        errors: list = [None] * len(seqs)
        processed = self.apply_logits_processors(seqs, logits[beam_rows], errors)
        temperatures = [s.request.params.beam_temperature for s in seqs]
        if any(t != 1.0 for t in temperatures):  # scores as vLLM's LLM.beam_search scales them
            scale = torch.tensor(temperatures, device=processed.device)
            processed = processed.float() / scale[:, None]
        logprobs = torch.log_softmax(processed.float(), dim=-1)
        for seq, row, error in zip(seqs, logprobs, errors, strict=True):
            if error is not None:
                self.fail(seq.request, error)
                touched[seq.request.request_id] = seq.request
            elif not seq.finished:
                self.record(seq, row)
        for request in {s.request.request_id: s.request for s in seqs}.values():
            if request.finished:
                continue
            try:
                if self.step_if_ready(request):
                    touched[request.request_id] = request
            except Exception as exc:  # the strategy failed this group alone
                self.fail(request, strategy_error(exc, request.beam.plugin_name))
                touched[request.request_id] = request
        rest = [i for i, s in enumerate(sampled) if s.request.beam is None]
        return [sampled[i] for i in rest], logits[rest]

    def record(self, seq: Sequence, logprobs: torch.Tensor) -> None:
        seq.beam_logprobs = logprobs

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
                self.finish(beam, "stop")
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
                child.token_ids = list(parent.token_ids)
                child.num_computed_tokens = parent.num_computed_tokens
                child.cumulative_logprob = parent.cumulative_logprob
                request.seqs.append(child)
                if parent.status is SequenceStatus.RUNNING:
                    self.block_manager.fork(parent, child)
                    self.scheduler.add_running(child, parent.lora_slot)
                else:  # the parent was preempted meanwhile: recompute the child too
                    child.num_computed_tokens = 0
                    self.scheduler.add(child)
                new.append(child)
            else:
                taken.add(p)
                new.append(parent)
        for seq, token in zip(new, tokens, strict=True):
            seq.token_ids.append(token)
        for p, beam in enumerate(old):
            if p not in taken:
                self.finish(beam, "stop")
        group.beams = new


def strategy_error(exc: Exception, plugin_name: str) -> PluginError:
    """A decoding strategy (beam search included) is a plugin: its failure names it."""
    return PluginError(
        plugin_name,
        f"decoding strategy of plugin {plugin_name!r} raised {type(exc).__name__}: {exc}",
    )

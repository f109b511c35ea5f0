"""Beam search as a decoding strategy ("beam"), equal to HF transformers' (4.57) token for
token in float32 when fed the same log-probabilities.

Each step mirrors ``GenerationMixin._beam_search`` for one prompt, tensor op for tensor op
(so float32 rounding and topk tie-breaking agree):

1. Scores: ``logprobs`` (log_softmax of the running beams' logits) plus each beam's running
   score. Before ``min_tokens`` tokens exist, EOS log-probabilities are set to -inf after
   the log_softmax (HF's min-new-tokens processor), so pass unmasked log-probabilities.
   At the start there is one running sequence (the prompt); HF runs W copies of it whose
   scores are 0, -1e9, -1e9, ...: the copies are rebuilt here, so the engine forks only
   once it knows the first W tokens.
2. Candidates: the top K = max(2, 1 + #EOS ids) * W continuations over all beams.
   A candidate "hits" when its token is an EOS id or it reaches ``max_tokens``.
3. Running beams: the best W candidates, hits pushed down by -1e9 (they only run when
   nothing else is left, i.e. at ``max_tokens``, where the search ends anyway).
4. Finished hypotheses: a hit among the top W candidates enters the W-slot finished list,
   scored ``sum_logprob / generated_len ** length_penalty`` (generated_len counts the EOS
   token), if it beats the worst kept one; only hypotheses when all slots are full and
   ``early_stopping is True`` or when the heuristic says no improvement is possible stop
   entering.
5. Stop when: no improvement is possible (``_check_early_stop_heuristic``: best running
   score over ``step ** length_penalty`` (or ``max_tokens ** length_penalty`` with
   early_stopping="never" and length_penalty > 0) is no better than every kept
   hypothesis, once all W slots are full), or all W slots are full and
   ``early_stopping is True``, or every candidate hit (``max_tokens``).

``finish`` returns the best ``n`` hypotheses (HF's ``sequences`` and ``sequences_scores``):
tokens generated including a final EOS, and the length-penalised score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from loragate.plugins.decoding import Hypothesis, StepDecision
from loragate.plugins.markers import hookimpl

# HF's stand-in for "impossible" scores (running copies of the prompt, empty hypothesis
# slots, hits that must not run on).
IMPOSSIBLE = -1.0e9


@dataclass
class BeamState:
    """One group's beam search: running beams, finished slots, and the stop test."""

    width: int
    n: int
    length_penalty: float
    early_stopping: bool | str
    eos_token_ids: list[int]
    max_tokens: int
    min_tokens: int
    candidates: int
    running_tokens: list[list[int]]
    running_scores: torch.Tensor  # [1, W] float32, best first after the first step
    finished_tokens: list[list[int] | None]  # W slots, best first; None: still empty
    finished_scores: torch.Tensor  # [1, W] float32
    finished_flags: torch.Tensor  # [1, W] bool
    improvement_possible: torch.Tensor = field(
        default_factory=lambda: torch.ones((1, 1), dtype=torch.bool)
    )
    step: int = 0
    done: bool = False

    @property
    def num_running(self) -> int:
        """How many logprob rows the next ``step`` expects."""
        return 0 if self.done else len(self.running_tokens)


class BeamSearch:
    """The "beam" decoding strategy; see the module docstring."""

    def start(self, params: dict, eos_token_ids, max_tokens: int) -> BeamState:
        best_of = params.get("best_of")
        width = _positive_int(params.get("n", 1) if best_of is None else best_of, "best_of")
        n = _positive_int(params.get("n", 1), "n")
        if n > width:
            raise ValueError(f"n ({n}) must be <= best_of, the beam width ({width})")
        length_penalty = params.get("length_penalty", 1.0)
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, int | float):
            raise ValueError(f"length_penalty must be a number, got {length_penalty!r}")
        early_stopping = params.get("early_stopping", False)
        if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
            raise ValueError(
                f"early_stopping must be True, False or 'never', got {early_stopping!r}"
            )
        min_tokens = params.get("min_tokens", 0) or 0
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
            raise ValueError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
        max_tokens = _positive_int(max_tokens, "max_tokens")
        eos = sorted({int(token) for token in eos_token_ids or ()})
        if any(token < 0 for token in eos):
            raise ValueError(f"eos_token_ids must be >= 0, got {eos}")
        return BeamState(
            width=width,
            n=n,
            length_penalty=float(length_penalty),
            early_stopping=early_stopping,
            eos_token_ids=eos,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            candidates=max(2, 1 + len(eos)) * width,
            running_tokens=[[]],
            running_scores=_first_running_scores(width),
            finished_tokens=[None] * width,
            finished_scores=torch.full((1, width), IMPOSSIBLE, dtype=torch.float32),
            finished_flags=torch.zeros((1, width), dtype=torch.bool),
        )

    def step(self, state: BeamState, logprobs: torch.Tensor) -> StepDecision:
        if state.done:
            raise ValueError("beam search is done: call finish()")
        rows = len(state.running_tokens)
        if (
            not isinstance(logprobs, torch.Tensor)
            or logprobs.dim() != 2
            or logprobs.shape[0] != rows
        ):
            shape = tuple(logprobs.shape) if isinstance(logprobs, torch.Tensor) else logprobs
            raise ValueError(
                f"logprobs must be [{rows}, vocab] (one row per running beam), got {shape}"
            )
        width, vocab = state.width, logprobs.shape[1]
        if vocab < state.candidates:
            raise ValueError(
                f"vocab ({vocab}) is smaller than the {state.candidates} beam candidates"
            )
        device = logprobs.device
        log_probs = self._masked_for_min_tokens(state, logprobs.to(torch.float32))
        # Step 1: accumulated scores over every beam's vocabulary (at the first step the one
        # prompt row broadcasts over HF's W copies of it); step 2: the top K.
        scores = log_probs.unsqueeze(0) + state.running_scores.to(device)[:, :, None]
        scores = torch.reshape(scores, (1, width * vocab))
        topk_scores, topk_indices = torch.topk(scores, k=state.candidates)
        topk_scores, topk_indices = topk_scores.cpu(), topk_indices.cpu()
        topk_beams = topk_indices // vocab
        topk_tokens = topk_indices % vocab
        hits = torch.isin(topk_tokens, torch.tensor(state.eos_token_ids, dtype=torch.long))
        if state.step + 1 >= state.max_tokens:
            hits = torch.ones_like(hits)
        candidate_tokens = [
            state.running_tokens[min(beam, rows - 1)] + [token]
            for beam, token in zip(topk_beams[0].tolist(), topk_tokens[0].tolist(), strict=True)
        ]
        # Step 3: the next running beams.
        running_scores = topk_scores + hits.to(torch.float32) * IMPOSSIBLE
        next_indices = torch.topk(running_scores, k=width)[1]
        state.running_scores = torch.take_along_dim(running_scores, next_indices, dim=1)
        chosen = next_indices[0].tolist()
        parents = [min(int(topk_beams[0, i]), rows - 1) for i in chosen]
        tokens = [int(topk_tokens[0, i]) for i in chosen]
        state.running_tokens = [candidate_tokens[i] for i in chosen]
        # Step 4: finished hypotheses, then step 5: the stop test.
        self._update_finished(state, topk_scores, hits, candidate_tokens)
        state.step += 1
        self._update_improvement_possible(state)
        all_full = bool(torch.all(state.finished_flags)) and state.early_stopping is True
        state.done = not (
            bool(torch.any(state.improvement_possible)) and not all_full and not bool(hits.all())
        )
        if state.done:
            return StepDecision(parents=[], tokens=[], done=True)
        return StepDecision(parents=parents, tokens=tokens, done=False)

    def finish(self, state: BeamState) -> list[Hypothesis]:
        if not state.done:
            raise ValueError("beam search is not done yet: keep calling step()")
        scores = state.finished_scores[0, : state.n].tolist()
        return [
            Hypothesis(list(tokens or []), score)
            for tokens, score in zip(state.finished_tokens[: state.n], scores, strict=True)
        ]

    # -- HF's helpers, one prompt at a time -----------------------------------------------
    @staticmethod
    def _masked_for_min_tokens(state: BeamState, log_probs: torch.Tensor) -> torch.Tensor:
        if state.step >= state.min_tokens or not state.eos_token_ids:
            return log_probs
        vocab = torch.arange(log_probs.shape[-1], device=log_probs.device)
        eos = torch.tensor(state.eos_token_ids, device=log_probs.device)
        return torch.where(torch.isin(vocab, eos), float("-inf"), log_probs)

    @staticmethod
    def _update_finished(
        state: BeamState,
        topk_scores: torch.Tensor,
        hits: torch.Tensor,
        candidate_tokens: list[list[int]],
    ) -> None:
        top_width = torch.zeros(state.candidates, dtype=torch.bool)
        top_width[: state.width] = True
        just_finished = hits & top_width[None, :]
        scores = topk_scores / ((state.step + 1) ** state.length_penalty)
        slots_full = torch.all(state.finished_flags, dim=-1, keepdim=True) & (
            state.early_stopping is True
        )
        scores += slots_full.to(torch.float32) * IMPOSSIBLE
        scores += (~state.improvement_possible).to(torch.float32) * IMPOSSIBLE
        scores += (~just_finished) * IMPOSSIBLE
        merged_scores = torch.cat((state.finished_scores, scores), dim=1)
        merged_flags = torch.cat((state.finished_flags, just_finished), dim=1)
        merged_tokens = state.finished_tokens + candidate_tokens
        keep = torch.topk(merged_scores, k=state.width)[1]
        state.finished_scores = torch.take_along_dim(merged_scores, keep, dim=1)
        state.finished_flags = torch.take_along_dim(merged_flags, keep, dim=1)
        state.finished_tokens = [merged_tokens[i] for i in keep[0].tolist()]

    @staticmethod
    def _update_improvement_possible(state: BeamState) -> None:
        if state.early_stopping == "never" and state.length_penalty > 0.0:
            best_length = state.max_tokens
        else:
            best_length = state.step
        best_running = state.running_scores[:, :1] / (best_length**state.length_penalty)
        worst_finished = torch.where(
            state.finished_flags,
            torch.min(state.finished_scores, dim=1, keepdim=True)[0],
            IMPOSSIBLE,
        )
        state.improvement_possible = state.improvement_possible & torch.any(
            best_running > worst_finished, dim=-1, keepdim=True
        )


def _first_running_scores(width: int) -> torch.Tensor:
    scores = torch.zeros((1, width), dtype=torch.float32)
    scores[:, 1:] = IMPOSSIBLE
    return scores


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class BeamSearchPlugin:
    """Registers the "beam" strategy last, so a plugin's "beam" wins."""

    @hookimpl(trylast=True)
    def loragate_decoding_strategies(self):
        return {"beam": BeamSearch()}

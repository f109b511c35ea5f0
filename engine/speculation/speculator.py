"""Which decoding rows speculate this step, how far, and what was accepted.

The scheduler asks `drafts()` once per step for its running decodes and grants each
proposal room in the step (tokens from the budget, KV blocks); after the step it reports
what each verified row accepted (`record`), which steers the next steps:

- per request: `SamplingParams.speculative=False` opts out; beam search and plugin samplers
  (whose state may hang on being called once per token) never speculate;
- per step: none where the batch is already compute-bound, that is when the rows' proposals
  would not fit in the token budget left after every decode and every pending prompt token
  (the scheduler passes that `spare`), or past `disable_by_batch_size` decoding rows; and
  of the proposals, only the tokens whose expected yield pays for their compute under the
  engine's measured step-time model (`_worth_running`);
- per adapter: the acceptance rate measured for it (accepted over proposed tokens of its
  recent verified rows); below `min_acceptance` the adapter stops speculating and probes with
  one row every `PROBE_EVERY` steps (`DRAFT_PROBE_EVERY` under a draft model, whose probe
  costs the row's context run through the draft), so a workload with nothing to copy turns
  speculation off by itself;
- per row: the row's own recent rate, drawn toward its adapter's while it has few verified
  tokens, sets its k (from `num_speculative_tokens` at a high rate down to one token) and
  its tokens' value in the step-time rule: in free text some streams copy and others do not.

Counts per (adapter, method), as vLLM's spec-decode metrics: drafts, draft tokens,
accepted tokens, and accepted tokens by position.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from loragate.engine.core.sequence import Sequence
from loragate.engine.speculation.config import SpeculativeConfig

log = logging.getLogger(__name__)

# Per verified row, the weight left to the rows before it in an adapter's acceptance rate
# (accepted over proposed tokens, both decayed: about the last 50 rows count), and the rate
# an adapter starts at.
ACCEPTANCE_DECAY = 0.98
INITIAL_ACCEPTANCE = 0.7
# A row's own rate (its recent verified proposals, decayed faster: about the last 10 count)
# against its adapter's: the adapter's rate weighs as ROW_PRIOR proposed tokens, so a new row
# starts at it and a row that copies (or does not) departs from it within a few steps.
ROW_DECAY = 0.9
ROW_PRIOR = 4.0
# At this rate and above a row proposes num_speculative_tokens; below, proportionally fewer.
FULL_K_ACCEPTANCE = 0.6
PROBE_EVERY = 32
# A draft model's probe first runs the row's context through the draft (every token since
# it last proposed), so rows under it probe this much less often.
DRAFT_PROBE_EVERY = 8 * PROBE_EVERY
# The highest acceptance rate a token's expected value is computed with (a rate of 1 would
# value every position alike).
MAX_RATE = 0.98
# An allowance for what the step-time model leaves out of a verified token's cost: its row
# runs with the prompts' attention, and each position is sampled in a round of its own
# (BENCHMARKS.md, "Speculative decoding", has runs with 1.0 and with this).
VERIFY_COST_FACTOR = 1.25


class StepTime(Protocol):
    """A step's time as fixed_ms + ms_per_token * tokens (engine/core/step_budget.py's fit)."""

    fixed_ms: float
    ms_per_token: float


@dataclass
class SpecCounts:
    """Speculation's counts for one (adapter, method)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        proposer,
        max_model_len: int,
        vocab_size: int,
        step_time: StepTime | None = None,
        proposal_cost: float = 0.0,
    ):
        """`proposer(rows, options)`: the hook's (plain data), already looked up by name.
        `step_time`: the engine's model of a step's time (engine/core/step_budget.py); without
        one (or with no cost per token measured) every proposal that fits is run.
        `proposal_cost`: what proposing costs against the target's forward, as a fraction of
        it (a draft model's weights against the target's; 0 for a lookup)."""
        self.proposal_cost = proposal_cost
        self.config = config
        self.step_time = step_time
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # adapter name -> (accepted, proposed) tokens, decayed per verified row
        self.acceptance: dict[str | None, tuple[float, float]] = {}
        # seq_id -> (accepted, proposed) tokens of the running rows, decayed per verified step
        self.rows: dict[int, tuple[float, float]] = {}
        self.counts: dict[tuple[str | None, str], SpecCounts] = {}
        self.steps = 0
        self._failed_once = False

    def drafts(self, decodes: Seq[Sequence], spare: int) -> dict[int, list[int]]:
        """Proposals by seq_id for some of `decodes` (running, one token to compute each),
        their lengths summing to at most `spare` tokens."""
        self.steps += 1
        # Only running decodes keep their history (a finished or preempted row's goes).
        self.rows = {s.seq_id: self.rows[s.seq_id] for s in decodes if s.seq_id in self.rows}
        limit = self.config.disable_by_batch_size
        if spare <= 0 or not decodes or (limit is not None and len(decodes) > limit):
            return {}
        rows, seqs, probes = [], [], set()
        for seq in decodes:
            k = self._k_for(seq)
            if k < 0:  # a probe: one token, whatever the step-time rule would say of it
                k = 1
                probes.add(seq.seq_id)
            if k > 0:
                rows.append(_row(seq, k))
                seqs.append(seq)
        if not rows:
            return {}
        if self.proposal_cost > 0:
            # Proposing costs (a draft model's forwards): decide first how many tokens each
            # row's proposal may bring, from the rates alone, and ask only for those.
            planned = {r["seq_id"]: [0] * min(r["max_tokens"], spare) for r in rows}
            kept_rows = self._worth_running(
                {i: p for i, p in planned.items() if i not in probes},
                {s.seq_id: s for s in seqs},
                len(decodes),
            )
            wanted = {i: len(p) for i, p in kept_rows.items()}
            wanted |= {i: 1 for i in probes if planned.get(i)}
            pairs = [(s, r) for s, r in zip(seqs, rows, strict=True) if wanted.get(s.seq_id)]
            if not pairs:
                return {}
            seqs = [s for s, _ in pairs]
            rows = [r | {"max_tokens": wanted[s.seq_id]} for s, r in pairs]
        answers = self._propose(rows)
        drafts: dict[int, list[int]] = {}
        for seq, row, proposal in zip(seqs, rows, answers, strict=True):
            proposal = proposal[: min(row["max_tokens"], spare)]
            if proposal:
                drafts[seq.seq_id] = proposal
                spare -= len(proposal)
            if spare <= 0:
                break
        probed = {i: drafts.pop(i) for i in probes if i in drafts}
        kept = self._worth_running(drafts, {s.seq_id: s for s in seqs}, len(decodes))
        return kept | probed

    def _worth_running(
        self, drafts: dict[int, list[int]], seqs: dict[int, Sequence], num_decodes: int
    ) -> dict[int, list[int]]:
        """The proposal tokens that raise the step's expected output per millisecond.

        A step of T tokens takes about fixed + per_token * T ms (the step budget's fit);
        proposal token i of a row whose adapter accepts at rate a adds a^i expected output
        tokens. Tokens go in by that value, best first, while one more raises the expected
        tokens per ms: a^i * time(T) > E * per_token * VERIFY_COST_FACTOR, with E the
        expected tokens so far (the decodes' one each, then what was taken). So a batch that
        is compute-bound already (a large T, or a per-token cost that dominates) takes only
        well-accepted tokens. A draft model's token also costs its own decode position:
        proposal_cost times a one-row step of the target."""
        step_time = self.step_time
        if step_time is None or step_time.ms_per_token <= 0 or not drafts:
            return drafts
        candidates = []
        for seq_id, proposal in drafts.items():
            rate = min(self.row_rate(seqs[seq_id]), MAX_RATE)
            candidates += [(rate**i, seq_id, i) for i in range(1, len(proposal) + 1)]
        candidates.sort(key=lambda c: c[0], reverse=True)
        expected, tokens, per_token = float(num_decodes), num_decodes, step_time.ms_per_token
        # Each proposal token is also one decode position of the proposer (a draft model's
        # forward: its own fixed cost and one row's, at proposal_cost of the target's).
        draft_ms = self.proposal_cost * (step_time.fixed_ms + per_token)
        cost = per_token * VERIFY_COST_FACTOR + draft_ms
        kept: dict[int, int] = {}
        for value, seq_id, i in candidates:
            if value * (step_time.fixed_ms + per_token * tokens) <= expected * cost:
                break
            expected += value
            tokens += 1
            kept[seq_id] = max(kept.get(seq_id, 0), i)
        return {seq_id: drafts[seq_id][:n] for seq_id, n in kept.items()}

    def record(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """A verified row: `accepted` of its `proposed` tokens were the target's."""
        adapter = _adapter(seq)
        counts = self.counts.setdefault((adapter, self.config.method), SpecCounts())
        counts.drafts += 1
        counts.draft_tokens += proposed
        counts.accepted_tokens += accepted
        per_position = counts.accepted_per_position
        if len(per_position) < proposed:
            per_position.extend([0] * (proposed - len(per_position)))
        for i in range(accepted):
            per_position[i] += 1
        got, asked = self.acceptance.get(adapter, (0.0, 0.0))
        self.acceptance[adapter] = (
            got * ACCEPTANCE_DECAY + accepted,
            asked * ACCEPTANCE_DECAY + proposed,
        )
        got, asked = self.rows.get(seq.seq_id, (0.0, 0.0))
        self.rows[seq.seq_id] = (got * ROW_DECAY + accepted, asked * ROW_DECAY + proposed)

    def acceptance_rate(self, adapter: str | None) -> float:
        """The adapter's recent acceptance rate (INITIAL_ACCEPTANCE before any row)."""
        got, asked = self.acceptance.get(adapter, (0.0, 0.0))
        return got / asked if asked else INITIAL_ACCEPTANCE

    def row_rate(self, seq: Sequence) -> float:
        """The row's expected acceptance: its own recent rate, drawn toward its adapter's."""
        prior = self.acceptance_rate(_adapter(seq))
        got, asked = self.rows.get(seq.seq_id, (0.0, 0.0))
        return (got + ROW_PRIOR * prior) / (asked + ROW_PRIOR)

    def _k_for(self, seq: Sequence) -> int:
        """How many tokens this row may propose: 0 when it does not speculate, -1 for a probe
        (one token, run to measure a rate that fell below min_acceptance again)."""
        request = seq.request
        params = request.params
        if not params.speculative or request.beam is not None or params.sampler is not None:
            return 0
        # Never past what the request may still produce (the bonus token is one more) or
        # past the context.
        room = self.max_model_len - seq.num_tokens - 1
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - (seq.num_tokens - seq.prompt_len) - 1)
        if room <= 0:
            return 0
        k = self.config.num_speculative_tokens
        rate = self.row_rate(seq)
        if min(rate, self.acceptance_rate(_adapter(seq))) < self.config.min_acceptance:
            every = DRAFT_PROBE_EVERY if self.config.method == "draft_model" else PROBE_EVERY
            return 0 if (self.steps + seq.seq_id) % every else -1
        if rate < FULL_K_ACCEPTANCE:
            k = max(1, round(k * rate / FULL_K_ACCEPTANCE))
        return min(k, room)

    def _propose(self, rows: list[dict]) -> list[list[int]]:
        """The proposer's answer, checked; one that fails or answers badly proposes nothing
        this step (speculation only ever saves time: outputs never depend on it)."""
        try:
            answers = self.proposer(rows, self.config.proposer_options())
            if not isinstance(answers, list) or len(answers) != len(rows):
                raise ValueError(f"expected a list of {len(rows)} proposals, got {answers!r:.80}")
            return [_checked(answer, self.vocab_size) for answer in answers]
        except Exception:
            if not self._failed_once:
                log.exception(
                    "speculative proposer %r failed; no proposals this step", self.config.method
                )
                self._failed_once = True
            return [[] for _ in rows]

    def stats(self) -> list[dict]:
        """Per (adapter, method): the counts and acceptance rate, as plain data."""
        return [
            {
                "adapter": adapter,
                "method": method,
                "drafts": c.drafts,
                "draft_tokens": c.draft_tokens,
                "accepted_tokens": c.accepted_tokens,
                "accepted_per_position": list(c.accepted_per_position),
                "acceptance_rate": c.acceptance_rate,
            }
            for (adapter, method), c in self.counts.items()
        ]


def _row(seq: Sequence, k: int) -> dict:
    return {
        "seq_id": seq.seq_id,
        "token_ids": list(seq.token_ids),
        "num_prompt_tokens": seq.prompt_len,
        "lora_name": _adapter(seq),
        "max_tokens": k,
    }


def _adapter(seq: Sequence) -> str | None:
    lora = seq.lora_request
    return lora.lora_name if lora is not None else None


def _checked(answer, vocab_size: int) -> list[int]:
    if not isinstance(answer, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in answer
    ):
        raise ValueError(f"a proposal must be a list of token ids, got {answer!r:.80}")
    return list(answer)

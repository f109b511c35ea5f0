"""Output processing beside the step: text, stop strings and the outputs callers see.

The step thread hands over each step's new token ids (engine/core/step_output.py); this turns
them into text (one incremental detokenizer per sample), finds stop strings, holds back text
that may still become one, and builds the RequestOutputs: cumulative, or under
RequestOutputKind.DELTA (the streaming path) only what each sample has not yet carried, so
a stream's outputs do not grow with its length. It runs on its own
thread in AsyncLLMEngine, while the next step computes, and inline after each step in the
offline LLM: the same code either way, one processor per engine.

A stop string is found here, after the step that made it: the sample's output ends at the
token that completed it (tokens the step took since are dropped), and a SeqStop tells the
step thread to finish the sample and free its blocks (vLLM V1's `reqs_to_abort`). Its state
is only what it read from the step's records, so it never reads a sequence the step thread
is changing.
"""

from __future__ import annotations

from loragate.engine.core.sequence import Request
from loragate.engine.core.step_output import RequestTokens, SeqStop, SeqTokens, StepOutput
from loragate.engine.outputs.detokenizer import IncrementalDetokenizer
from loragate.engine.outputs.output_builder import error_output, failure_reason, request_output
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.outputs.stopping import StopDecision, stop_by_text
from loragate.engine.sampling.sampling_params import RequestOutputKind

# Reasons the step thread ends a sample with that are not a token's: nothing is cut.
_ENDED_BY_ENGINE = ("abort", "error")


class SampleText:
    """One sample's output as its caller sees it: token ids, text, logprobs, finish."""

    __slots__ = (
        "index",
        "detokenizer",
        "token_ids",
        "text",
        "logprobs",
        "cumulative_logprob",
        "finish_reason",
        "stop_reason",
        "sent_tokens",
        "sent_chars",
    )

    def __init__(self, index: int, request: Request, detokenizer):
        params = request.params
        self.index = index
        self.detokenizer = detokenizer
        self.token_ids: list[int] = []
        self.text = ""
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.scores_tokens else None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        # What this sample's outputs have carried so far (RequestOutputKind.DELTA's start).
        self.sent_tokens = 0
        self.sent_chars = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestText:
    """A request's outputs so far, with what the step last said of it."""

    __slots__ = (
        "request",
        "samples",
        "error",
        "error_type",
        "first_token_time",
        "first_scheduled_time",
        "prompt_logprobs",
        "prompt_logprobs_sent",
        "beam_results",
        "step_finished",
    )

    def __init__(self, request: Request, samples: list[SampleText]):
        self.request = request
        self.samples = samples
        self.error: str | None = None
        self.error_type: str | None = None
        self.first_token_time: float | None = None
        self.first_scheduled_time: float | None = None
        self.prompt_logprobs: list | None = None
        self.prompt_logprobs_sent = False  # under DELTA they go in one output only
        self.beam_results: list | None = None
        self.step_finished = False

    @property
    def finished(self) -> bool:
        if self.request.beam is not None or not self.samples:
            return self.step_finished
        return all(s.finished for s in self.samples)


class OutputProcessor:
    def __init__(self, tokenizer, eos_token_ids: set[int]):
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.states: dict = {}  # request_id -> RequestText

    def __len__(self) -> int:
        return len(self.states)

    def new_detokenizer(self, request: Request) -> IncrementalDetokenizer:
        params = request.params
        return IncrementalDetokenizer(
            self.tokenizer,
            request.prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )

    def process(
        self, step: StepOutput, answer_aborts: bool = False
    ) -> tuple[list[tuple[Request, RequestOutput]], list[SeqStop]]:
        """The step's outputs, each with the request it answers, and the samples the step
        thread should stop. With ``answer_aborts`` (a caller may still be waiting on the
        request: the async engine), a request aborted since the last step gets a last
        output, finished with "abort" (vLLM's AsyncLLM answers an abort so)."""
        outputs: list[tuple[Request, RequestOutput]] = []
        for added, request in step.events:
            if added:
                self._add(request)
            elif (state := self._state(request)) is not None:
                del self.states[request.request_id]
                if answer_aborts:
                    outputs.append((request, self._aborted(state)))
        stops: list[SeqStop] = []
        for record in step.requests:
            state = self._state(record.request)
            if state is None:  # it ended here already; the step had not heard yet
                continue
            out = self._process_request(state, record, stops)
            if out is not None:
                outputs.append((state.request, out))
        return outputs, stops

    def _add(self, request: Request) -> None:
        params = request.params
        width = 0 if params.use_beam_search else params.best_of
        samples = [SampleText(i, request, self.new_detokenizer(request)) for i in range(width)]
        self.states[request.request_id] = RequestText(request, samples)

    def _state(self, request: Request) -> RequestText | None:
        state = self.states.get(request.request_id)
        return state if state is not None and state.request is request else None

    def _process_request(
        self, state: RequestText, record: RequestTokens, stops: list[SeqStop]
    ) -> RequestOutput | None:
        if record.error is not None:
            state.error, state.error_type = record.error, record.error_type
        state.first_token_time = record.first_token_time
        state.first_scheduled_time = record.first_scheduled_time
        if record.prompt_logprobs is not None:
            state.prompt_logprobs = record.prompt_logprobs
        if record.beam_results is not None:
            state.beam_results = record.beam_results
        state.step_finished = record.finished
        try:
            for tokens in record.seqs:
                sample = state.samples[tokens.index]
                if not sample.finished and self._take(state.request, sample, tokens):
                    stops.append(_stop(state.request, sample))
        except Exception as exc:  # its text failed: it alone ends, with what it has
            self._fail(state, exc, stops)
        finished = state.finished
        if not finished and (state.request.beam is not None or _final_only(state.request)):
            return None  # beam search answers once, at the end
        try:
            out = request_output(state, self.tokenizer, self.eos_token_ids, finished)
        except Exception as exc:  # its answer could not be built: it ends with an error
            self._fail(state, exc, stops)
            out, finished = error_output(state), True
        if finished:
            del self.states[state.request.request_id]
        return out

    def _aborted(self, state: RequestText) -> RequestOutput:
        """The last output of an aborted request: what it had, its open samples ended with
        "abort"."""
        for sample in state.samples:
            if not sample.finished:
                sample.finish_reason, sample.stop_reason = "abort", None
        state.step_finished = True
        try:
            return request_output(state, self.tokenizer, self.eos_token_ids, True)
        except Exception as exc:  # e.g. a beam search stopped before it had beams
            state.error, state.error_type = failure_reason(
                state.request.request_id, exc, state.error, state.error_type
            )
            return error_output(state)

    def _take(self, request: Request, sample: SampleText, tokens: SeqTokens) -> bool:
        """Add the step's tokens to a sample; True when a stop string (found here) ends it
        before the step knows."""
        params = request.params
        last = len(tokens.results) - 1
        for i, result in enumerate(tokens.results):
            token_id = result.token_id
            sample.token_ids.append(token_id)
            if sample.cumulative_logprob is not None:
                sample.cumulative_logprob += result.logprob
            if sample.logprobs is not None:
                sample.logprobs.append(result.top_logprobs or {token_id: result.logprob})
            delta = sample.detokenizer.step([token_id])
            sample.text += delta
            by_token = None
            if i == last and tokens.finish_reason not in (None, *_ENDED_BY_ENGINE):
                by_token = StopDecision(tokens.finish_reason, tokens.stop_reason)
            decision = stop_by_text(
                params, len(sample.token_ids), sample.text, len(delta), by_token
            )
            if decision is not None:
                self._finish(sample, decision)
                return by_token is None and tokens.finish_reason is None
        if tokens.finish_reason is not None:  # aborted, failed: its text stays as it is
            sample.finish_reason, sample.stop_reason = tokens.finish_reason, tokens.stop_reason
        return False

    def _finish(self, sample: SampleText, decision: StopDecision) -> None:
        """The text of a sample that stops is flushed and cut to what it keeps."""
        sample.text += sample.detokenizer.flush()
        if decision.truncate_to is not None:
            sample.text = sample.text[: decision.truncate_to]
        sample.finish_reason = decision.finish_reason
        sample.stop_reason = decision.stop_reason

    def _fail(self, state: RequestText, exc: Exception, stops: list[SeqStop]) -> None:
        """This request's output failed: it ends with an error, and the step thread stops
        whatever of it still runs."""
        state.error, state.error_type = failure_reason(
            state.request.request_id, exc, state.error, state.error_type
        )
        for sample in state.samples:
            if not sample.finished:
                sample.finish_reason, sample.stop_reason = "error", None
                stops.append(_stop(state.request, sample))


def _final_only(request: Request) -> bool:
    return request.params.output_kind == RequestOutputKind.FINAL_ONLY


def _stop(request: Request, sample: SampleText) -> SeqStop:
    return SeqStop(
        request, sample.index, sample.finish_reason, sample.stop_reason, len(sample.token_ids)
    )

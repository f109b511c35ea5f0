"""RequestOutputs from what output processing holds of a request: streamed text, best_of,
beam results."""

from __future__ import annotations

import logging
import time

from loragate.engine.core.sequence import Request
from loragate.engine.outputs.request_output import CompletionOutput, RequestMetrics, RequestOutput
from loragate.engine.outputs.stopping import stream_safe_len
from loragate.engine.sampling.sampling_params import RequestOutputKind
from loragate.plugins import PluginError

log = logging.getLogger(__name__)


def request_output(state, tokenizer, eos_token_ids: set[int], finished: bool) -> RequestOutput:
    """The output of a request (output_processor.RequestText) so far: everything, or under
    RequestOutputKind.DELTA what each sample has not carried yet (a beam search answers
    once, whole, either way)."""
    request = state.request
    others = None
    if request.beam is not None and state.error is not None and not state.beam_results:
        outputs = failed_completions(request.params.n)  # it failed before any hypothesis
    elif request.beam is not None:
        outputs = _beam_completions(state, tokenizer, eos_token_ids)
    else:
        samples, n = state.samples, request.params.n
        if finished and len(samples) > n:  # best_of: keep the n most likely, report the rest
            samples = sorted(samples, key=lambda s: s.cumulative_logprob, reverse=True)
            others = [completion(request, s) for s in samples[n:]]
        outputs = [completion(request, s) for s in samples[:n]]
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=outputs,
        finished=finished,
        lora_request=request.lora_request,
        lora_sha256=request.adapter_identity.sha256 if request.adapter_identity else None,
        error=state.error,
        error_type=state.error_type,
        prompt_logprobs=_prompt_logprobs(state),
        best_of_sequences=others,
        metrics=RequestMetrics(
            request.arrival_time,
            state.first_token_time,
            time.monotonic() if finished else None,
            first_scheduled_time=state.first_scheduled_time,
        ),
    )


def _prompt_logprobs(state) -> list | None:
    """Under RequestOutputKind.DELTA, in the first output that has them only (vLLM's)."""
    if state.request.params.output_kind != RequestOutputKind.DELTA:
        return state.prompt_logprobs
    if state.prompt_logprobs is None or state.prompt_logprobs_sent:
        return None
    state.prompt_logprobs_sent = True
    return state.prompt_logprobs


def error_output(state) -> RequestOutput:
    """The answer of a request whose own answer could not be built."""
    request = state.request
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=failed_completions(request.params.n),
        finished=True,
        lora_request=request.lora_request,
        error=state.error,
        error_type=state.error_type,
    )


def prompt_logprobs(request: Request) -> list | None:
    """A complete list once the prompt is computed (as vLLM: the first output has it)."""
    got = request.prompt_logprobs
    if got is None or len(got) < len(request.prompt_token_ids):
        return None
    return list(got)


def failed_completions(n: int) -> list[CompletionOutput]:
    """What a request that failed with nothing to show answers: n empty, errored samples."""
    return [CompletionOutput(i, "", [], None, None, finish_reason="error") for i in range(n)]


def completion(request: Request, sample) -> CompletionOutput:
    """While streaming, text that could still become a stop string is held back. Under
    RequestOutputKind.DELTA, only the tokens, logprobs and text this sample has not carried
    yet (its cumulative_logprob stays the whole sum, as vLLM's)."""
    text, params = sample.text, request.params
    end = len(text) if sample.finished else stream_safe_len(text, params)
    start_token = start_char = 0
    if params.output_kind == RequestOutputKind.DELTA:
        start_token, start_char = sample.sent_tokens, sample.sent_chars
        sample.sent_tokens = len(sample.token_ids)
        sample.sent_chars = max(start_char, end)
    logprobs = sample.logprobs
    return CompletionOutput(
        index=sample.index,
        text=text[start_char:end],
        token_ids=sample.token_ids[start_token:],
        cumulative_logprob=sample.cumulative_logprob,
        logprobs=logprobs[start_token:] if logprobs is not None else None,
        finish_reason=sample.finish_reason,
        stop_reason=sample.stop_reason,
    )


def _beam_completions(state, tokenizer, eos_token_ids) -> list[CompletionOutput]:
    params = state.request.params
    outputs = []
    for i, (tokens, score) in enumerate(state.beam_results[: params.n]):
        ended = bool(tokens) and tokens[-1] in eos_token_ids and not params.ignore_eos
        outputs.append(
            CompletionOutput(
                index=i,
                text=tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens),
                token_ids=list(tokens),
                cumulative_logprob=score,
                logprobs=None,
                finish_reason="stop" if ended or state.error else "length",
            )
        )
    return outputs


def record_failure(request: Request, error: Exception) -> None:
    """Say why a request failed (see `failure_reason`)."""
    request.error, request.error_type = failure_reason(
        request.request_id, error, request.error, request.error_type
    )


def failure_reason(
    request_id, error: Exception, current: str | None, current_type: str | None
) -> tuple[str | None, str | None]:
    """A failed request's (error, error_type): a plugin's error names the plugin; anything
    else is logged in full and reported without internals. The first reason given is kept."""
    if isinstance(error, PluginError):
        log.error("request %s failed: %s", request_id, error)
        return str(error), "plugin_error"
    if current is not None:
        return current, current_type
    log.error("request %s failed", request_id, exc_info=error)
    message = (
        f"this request failed on the engine ({type(error).__name__}); other requests are unaffected"
    )
    return message, "request_failed"

"""RequestOutputs from a request's sequences: streamed text, best_of, beam results."""

from __future__ import annotations

import logging
import time

from loragate.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from loragate.engine.sequence import Request, Sequence
from loragate.engine.stopping import stream_safe_len
from loragate.plugins import PluginError

log = logging.getLogger(__name__)


def request_output(request: Request, tokenizer, eos_token_ids: set[int]) -> RequestOutput:
    finished = request.finished
    others = None
    if request.beam is not None and request.error is not None and not request.beam.results:
        outputs = failed_completions(request.params.n)  # it failed before any hypothesis
    elif request.beam is not None:
        outputs = _beam_completions(request, tokenizer, eos_token_ids)
    else:
        seqs, n = request.seqs, request.params.n
        if finished and len(seqs) > n:  # best_of: keep the n most likely, report the rest
            seqs = sorted(seqs, key=lambda s: s.cumulative_logprob, reverse=True)
            others = [completion(seq) for seq in seqs[n:]]
        outputs = [completion(seq) for seq in seqs[:n]]
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=outputs,
        finished=finished,
        lora_request=request.lora_request,
        lora_sha256=request.adapter_identity.sha256 if request.adapter_identity else None,
        error=request.error,
        error_type=request.error_type,
        prompt_logprobs=_prompt_logprobs(request),
        best_of_sequences=others,
        metrics=RequestMetrics(
            request.arrival_time,
            request.first_token_time,
            time.monotonic() if finished else None,
            first_scheduled_time=request.first_scheduled_time,
        ),
    )


def error_output(request: Request) -> RequestOutput:
    """The answer of a request whose own answer could not be built."""
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=request.prompt_token_ids,
        outputs=failed_completions(request.params.n),
        finished=True,
        lora_request=request.lora_request,
        error=request.error,
        error_type=request.error_type,
    )


def _prompt_logprobs(request: Request) -> list | None:
    """A complete list once the prompt is computed (as vLLM: the first output has it)."""
    got = request.prompt_logprobs
    if got is None or len(got) < len(request.prompt_token_ids):
        return None
    return list(got)


def failed_completions(n: int) -> list[CompletionOutput]:
    """What a request that failed with nothing to show answers: n empty, errored samples."""
    return [CompletionOutput(i, "", [], None, None, finish_reason="error") for i in range(n)]


def completion(seq: Sequence) -> CompletionOutput:
    """While streaming, text that could still become a stop string is held back."""
    params = seq.request.params
    text = seq.text if seq.finished else seq.text[: stream_safe_len(seq.text, params)]
    return CompletionOutput(
        index=seq.index,
        text=text,
        token_ids=list(seq.output_token_ids),
        cumulative_logprob=seq.cumulative_logprob,
        logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
    )


def _beam_completions(request: Request, tokenizer, eos_token_ids) -> list[CompletionOutput]:
    params = request.params
    outputs = []
    for i, (tokens, score) in enumerate(request.beam.results[: params.n]):
        ended = bool(tokens) and tokens[-1] in eos_token_ids and not params.ignore_eos
        outputs.append(
            CompletionOutput(
                index=i,
                text=tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens),
                token_ids=list(tokens),
                cumulative_logprob=score,
                logprobs=None,
                finish_reason="stop" if ended or request.error else "length",
            )
        )
    return outputs


def record_failure(request: Request, error: Exception) -> None:
    """Say why a request failed: a plugin's error names the plugin; anything else is logged
    in full and reported without internals. The first reason given is kept."""
    if isinstance(error, PluginError):
        log.error("request %s failed: %s", request.request_id, error)
        request.error, request.error_type = str(error), "plugin_error"
    elif request.error is None:
        log.error("request %s failed", request.request_id, exc_info=error)
        request.error = (
            f"this request failed on the engine ({type(error).__name__}); "
            "other requests are unaffected"
        )
        request.error_type = "request_failed"

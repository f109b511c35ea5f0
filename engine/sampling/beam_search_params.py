"""vLLM's beam search API: `LLM.beam_search(prompts, BeamSearchParams(...))`.

It runs the engine's own beam search (`SamplingParams(use_beam_search=True)`, HF's
algorithm) and answers in vLLM's shapes: one BeamSearchOutput per prompt holding
`beam_width` sequences, best first. `temperature` divides the logits before the
log-probabilities that score the beams, as in vLLM; 0 (the default) leaves them unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.adapters import LoRARequest
from loragate.engine.outputs.request_output import RequestOutput
from loragate.engine.sampling.sampling_params import SamplingParams
from loragate.plugins import InvalidParam


@dataclass(frozen=True)
class BeamSearchParams:
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        width = self.beam_width
        if isinstance(width, bool) or not isinstance(width, int) or width < 2:
            raise InvalidParam("beam_width", f"beam_width must be an integer >= 2, got {width!r}")
        self.sampling_params()  # every other bad value fails here, naming its field

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(
            use_beam_search=True,
            n=self.beam_width,
            best_of=self.beam_width,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            ignore_eos=self.ignore_eos,
            length_penalty=self.length_penalty,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` are the prompt's then the generated ones, `text` the generated
    text, `cum_logprob` the length-penalised beam score. Per-token logprobs are not kept."""

    tokens: list[int]
    text: str
    cum_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    lora_request: LoRARequest | None = None
    logprobs: list[dict] | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence] = field(default_factory=list)


def beam_search_output(out: RequestOutput) -> BeamSearchOutput:
    return BeamSearchOutput(
        [
            BeamSearchSequence(
                tokens=list(out.prompt_token_ids) + list(c.token_ids),
                text=c.text,
                cum_logprob=c.cumulative_logprob,
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
                lora_request=out.lora_request,
            )
            for c in out.outputs
        ]
    )

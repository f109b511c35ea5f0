"""Per-request sampling settings, mirroring vLLM's ``SamplingParams``.

Every value is checked where the object is built, so a bad request fails with a
``ValueError`` naming the field before it reaches the scheduler or a KV block.
"""

from __future__ import annotations

import copy
import enum
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from loragate.engine.sampling.structured_outputs import (
    StructuredOutputsParams,
    structured_outputs_from,
)
from loragate.plugins import InvalidParam

# Temperatures below this are treated as greedy (vLLM uses the same epsilon).
GREEDY_TEMPERATURE_EPS = 1e-5

# Sane bounds, so that no value can overflow float32 logits or the beam score's
# ``length ** length_penalty`` (a Python float) for any length up to max_model_len.
MAX_TEMPERATURE = 100.0
REPETITION_PENALTY_RANGE = (0.01, 100.0)
MAX_ABS_LENGTH_PENALTY = 10.0
# OpenAI's range for logit_bias values; vLLM clamps to it too.
MAX_ABS_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 1024

log = logging.getLogger(__name__)

_PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class RequestOutputKind(enum.IntEnum):
    """What each of a request's outputs holds (vLLM's): everything so far (CUMULATIVE, the
    default), only what is new since the last output (DELTA: token ids, logprobs and text of
    this step, so a stream's outputs do not grow with it), or one output once finished."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """How to pick the tokens of one request and when to stop.

    ``top_k`` of 0 or -1 disables top-k; ``max_tokens=None`` means "until the model's
    context is full" (the engine enforces max_model_len); ``logprobs=N`` returns the N
    most likely tokens of every step plus the chosen one (0: only the chosen one);
    ``prompt_logprobs=N`` does the same for every prompt token after the first (such a
    request computes its whole prompt: no prefix-cache hits).
    With ``use_beam_search``, ``temperature`` scales the beam scores (see
    ``beam_temperature``) and ``top_k`` is ignored with a one-time warning.
    ``structured_outputs`` (or vLLM's older ``guided_decoding``) constrains the output to a
    JSON schema, regex, choice list or grammar; ``logit_bias`` maps token ids to values in
    [-100, 100] added to their logits, as OpenAI's field.
    """

    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    sampler: str | None = None
    sampler_args: dict[str, Any] | None = field(default=None)
    structured_outputs: StructuredOutputsParams | None = None
    guided_decoding: StructuredOutputsParams | None = None
    logit_bias: dict[int, float] | None = None
    # loragate's: False keeps this request out of speculative decoding (when the engine
    # has a speculative_config); its outputs are the same either way.
    speculative: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        self._normalise()
        self._verify_structured_outputs()
        self._verify_logit_bias()
        self._verify_counts()
        self._verify_probabilities()
        self._verify_penalties()
        self._verify_stops()
        self._verify_beam_search()
        self._verify_plugin_sampler()
        if not isinstance(self.speculative, bool):
            raise InvalidParam(
                "speculative", f"speculative must be true or false, got {self.speculative!r}"
            )
        if not isinstance(self.output_kind, RequestOutputKind):
            raise InvalidParam(
                "output_kind", f"output_kind must be a RequestOutputKind, got {self.output_kind!r}"
            )

    # -- normalisation -------------------------------------------------------------

    def _normalise(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, list | tuple):
            self.stop = list(self.stop)
        else:
            raise InvalidParam(
                "stop",
                f"stop must be a string or a list of strings, got {type(self.stop).__name__}",
            )
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, list | tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        else:
            raise InvalidParam(
                "stop_token_ids",
                "stop_token_ids must be a list of token ids, "
                f"got {type(self.stop_token_ids).__name__}",
            )
        for name in ("temperature", "top_p", "min_p", "length_penalty") + _PENALTY_FIELDS:
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise InvalidParam(name, f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        if self.best_of is None:
            self.best_of = self.n

    # -- checks --------------------------------------------------------------------

    def _verify_counts(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise InvalidParam("n", f"n must be an integer >= 1, got {self.n!r}")
        if not _is_int(self.best_of) or self.best_of < self.n:
            raise InvalidParam(
                "best_of", f"best_of must be an integer >= n ({self.n}), got {self.best_of!r}"
            )
        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            raise InvalidParam(
                "max_tokens", f"max_tokens must be an integer >= 1 or None, got {self.max_tokens!r}"
            )
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidParam(
                "min_tokens", f"min_tokens must be an integer >= 0, got {self.min_tokens!r}"
            )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidParam(
                "min_tokens",
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise InvalidParam(name, f"{name} must be an integer >= 0 or None, got {value!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise InvalidParam(
                "seed", f"seed must be an integer in [0, 2**63) or None, got {self.seed!r}"
            )
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidParam(
                "top_k", f"top_k must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}"
            )

    def _verify_probabilities(self) -> None:
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidParam(
                "temperature",
                f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}",
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidParam("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidParam("min_p", f"min_p must be in [0, 1], got {self.min_p}")

    def _verify_penalties(self) -> None:
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise InvalidParam(
                "repetition_penalty",
                f"repetition_penalty must be in [{low:g}, {high:g}], got {self.repetition_penalty}",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidParam(name, f"{name} must be in [-2, 2], got {value}")

    def _verify_stops(self) -> None:
        for text in self.stop:
            if not isinstance(text, str):
                raise InvalidParam("stop", f"stop must contain only strings, got {text!r}")
            if not text:
                raise InvalidParam("stop", "stop must not contain empty strings")
        for token_id in self.stop_token_ids:
            if not _is_int(token_id) or token_id < 0:
                raise InvalidParam(
                    "stop_token_ids",
                    f"stop_token_ids must be non-negative integers, got {token_id!r}",
                )

    def _verify_beam_search(self) -> None:
        if self.early_stopping not in (True, False, "never"):
            raise InvalidParam(
                "early_stopping",
                f"early_stopping must be True, False or 'never', got {self.early_stopping!r}",
            )
        if abs(self.length_penalty) > MAX_ABS_LENGTH_PENALTY:
            raise InvalidParam(
                "length_penalty",
                f"length_penalty must be in [-{MAX_ABS_LENGTH_PENALTY:g}, "
                f"{MAX_ABS_LENGTH_PENALTY:g}], got {self.length_penalty}",
            )
        if not self.use_beam_search:
            if self.length_penalty != 1.0:
                raise InvalidParam(
                    "length_penalty", "length_penalty only applies with use_beam_search=True"
                )
            if self.early_stopping is not False:
                raise InvalidParam(
                    "early_stopping", "early_stopping only applies with use_beam_search=True"
                )
            return
        if self.best_of < 2:
            raise InvalidParam(
                "best_of",
                f"best_of (the beam width) must be >= 2 for beam search, got {self.best_of}",
            )
        if self.top_p < 1.0:
            raise InvalidParam("top_p", "top_p must be 1 for beam search")
        if self.top_k not in (0, -1):
            _warn_top_k_ignored_once(self.top_k)
        if self.min_p > 0.0:
            raise InvalidParam("min_p", "min_p must be 0 for beam search")

    def _verify_plugin_sampler(self) -> None:
        if self.sampler is not None and (not isinstance(self.sampler, str) or not self.sampler):
            raise InvalidParam(
                "sampler", f"sampler must be a non-empty plugin sampler name, got {self.sampler!r}"
            )
        if self.sampler_args is not None:
            if not isinstance(self.sampler_args, dict):
                raise InvalidParam(
                    "sampler_args",
                    f"sampler_args must be a dict, got {type(self.sampler_args).__name__}",
                )
            if self.sampler is None:
                raise InvalidParam(
                    "sampler_args", "sampler_args needs sampler (a plugin sampler name)"
                )

    def _verify_structured_outputs(self) -> None:
        if self.guided_decoding is not None:
            if self.structured_outputs is not None:
                raise InvalidParam(
                    "structured_outputs", "give structured_outputs or guided_decoding, not both"
                )
            self.structured_outputs, self.guided_decoding = self.guided_decoding, None
        self.structured_outputs = structured_outputs_from(self.structured_outputs)

    def _verify_logit_bias(self) -> None:
        if self.logit_bias is None:
            return
        if not isinstance(self.logit_bias, dict):
            raise InvalidParam(
                "logit_bias", f"logit_bias must be a dict, got {type(self.logit_bias).__name__}"
            )
        if len(self.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
            raise InvalidParam(
                "logit_bias", f"logit_bias has more than {MAX_LOGIT_BIAS_ENTRIES} entries"
            )
        biases = {}
        for token, value in self.logit_bias.items():
            token_id = _token_id(token)
            if not _is_number(value) or abs(value) > MAX_ABS_LOGIT_BIAS:
                raise InvalidParam(
                    "logit_bias",
                    f"logit_bias values must be numbers in [-100, 100], got {value!r} for "
                    f"token {token!r}",
                )
            biases[token_id] = float(value)
        self.logit_bias = biases

    # -- derived -------------------------------------------------------------------

    @property
    def beam_temperature(self) -> float:
        """What beam search divides the logits by before log_softmax, as vLLM's
        `LLM.beam_search` does: the temperature, with 0 (greedy) meaning 1 (unscaled)."""
        return 1.0 if self.temperature < GREEDY_TEMPERATURE_EPS else self.temperature

    @property
    def greedy(self) -> bool:
        """True when the choice is the argmax: zero temperature, or top_k == 1."""
        return self.temperature < GREEDY_TEMPERATURE_EPS or self.top_k == 1

    @property
    def scores_tokens(self) -> bool:
        """Whether the sampler computes each chosen token's logprob (a softmax over the
        vocabulary): when logprobs are asked for, and when candidates are ranked by their
        cumulative logprob (best_of > n, beam search). Otherwise, as in vLLM V1, outputs
        carry no cumulative_logprob and greedy rows cost one argmax."""
        return self.logprobs is not None or self.best_of > self.n or self.use_beam_search

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def clone(self) -> SamplingParams:
        """A deep copy, so per-sequence changes never leak into the caller's object."""
        return copy.deepcopy(self)


def _token_id(key: Any) -> int:
    """OpenAI clients send the ids as JSON object keys, so strings of digits are ids too."""
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    if not _is_int(key) or key < 0:
        raise InvalidParam(
            "logit_bias", f"logit_bias keys must be token ids (integers >= 0), got {key!r}"
        )
    return key


_top_k_warned = False


def _warn_top_k_ignored_once(top_k: int) -> None:
    """vLLM code (the seed's included) passes top_k with beam search; it runs, once told."""
    global _top_k_warned
    if not _top_k_warned:
        _top_k_warned = True
        log.warning(
            "top_k=%d is ignored with use_beam_search=True: beam search ranks every token "
            "by its log-probability (this warning is shown once)",
            top_k,
        )

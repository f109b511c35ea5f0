"""vLLM's `speculative_config`: which proposer, how many tokens, and its own options.

Accepted as `LLM(speculative_config={...})`, `EngineConfig(speculative_config=...)` and
`loragate serve --speculative-config JSON`. Keys as vLLM names them:

- `method`: "ngram" (prompt lookup, the built-in), "draft_model" (a smaller model with
  the same vocabulary, `model`: its directory or GGUF file, engine/speculation/draft_model.py)
  or the name of a plugin's proposer (`loragate_speculative_proposers`); vLLM's
  "eagle"/"medusa"/... are refused with the reason.
- `num_speculative_tokens`: tokens proposed per row and step at most (1..16).
- `prompt_lookup_max` / `prompt_lookup_min`: the longest and shortest n-gram looked up
  (ngram only; 4 and 1 unless given).

loragate's own keys, each with a default that needs no tuning:

- `draft_adapters` (draft_model): `{adapter name: directory}` of PEFT adapters trained on
  the draft model; a row of such an adapter proposes with its draft adapter.
- `min_acceptance`: an adapter whose measured acceptance rate falls below this stops
  speculating (probing again now and then); 0 never stops.
- `disable_by_batch_size`: vLLM V0's key: no speculation in a step with more decoding rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

BUILTIN_METHODS = ("ngram", "draft_model")
# vLLM's methods loragate does not run, with what to use instead.
REFUSED_METHODS = {
    "eagle": "EAGLE heads are not supported; use method 'ngram'",
    "eagle3": "EAGLE-3 heads are not supported; use method 'ngram'",
    "medusa": "Medusa heads are not supported; use method 'ngram'",
    "mlp_speculator": "MLP speculators are not supported; use method 'ngram'",
    "deepseek_mtp": "MTP heads are not supported; use method 'ngram'",
    "suffix": "suffix decoding is not built in; a plugin may add it as a proposer",
}
MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    min_acceptance: float = 0.1
    disable_by_batch_size: int | None = None
    model: str | None = None  # draft_model: the draft's HF directory or GGUF file
    # draft_model: adapter name -> a PEFT adapter trained on the draft model, which that
    # adapter's rows propose with (the others with the plain draft).
    draft_adapters: dict[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"speculative_config.method must be a name, got {self.method!r}")
        if self.method in REFUSED_METHODS:
            raise ValueError(
                f"speculative_config.method {self.method!r}: {REFUSED_METHODS[self.method]}"
            )
        if (self.method == "draft_model") != (self.model is not None):
            raise ValueError(
                "speculative_config.model names the draft model of method 'draft_model' (and "
                f"only of it): got method {self.method!r} with model {self.model!r}"
            )
        if self.draft_adapters is not None:
            if self.method != "draft_model":
                raise ValueError("speculative_config.draft_adapters needs method 'draft_model'")
            if not isinstance(self.draft_adapters, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and k and v
                for k, v in self.draft_adapters.items()
            ):
                raise ValueError(
                    "speculative_config.draft_adapters must map adapter names to directories, "
                    f"got {self.draft_adapters!r}"
                )
        if self.model is not None and not isinstance(self.model, str):
            raise ValueError(f"speculative_config.model must be a path, got {self.model!r}")
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        _int_in("prompt_lookup_max", self.prompt_lookup_max, 1, 64)
        _int_in("prompt_lookup_min", self.prompt_lookup_min, 1, 64)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        rate = self.min_acceptance
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1:
            raise ValueError(
                f"speculative_config.min_acceptance must be a number in [0, 1), got {rate!r}"
            )
        if self.disable_by_batch_size is not None:
            _int_in("disable_by_batch_size", self.disable_by_batch_size, 1, 1 << 20)

    def proposer_options(self) -> dict:
        """What the proposer hook gets besides the rows (plain data)."""
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_max": self.prompt_lookup_max,
            "prompt_lookup_min": self.prompt_lookup_min,
        }


def speculative_config_from(value: Any) -> SpeculativeConfig | None:
    """None, a SpeculativeConfig, a dict of its keys, or that dict as JSON text."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative_config is not valid JSON: {exc}") from None
        if value is None:
            return None
    if not isinstance(value, dict):
        raise ValueError(
            f"speculative_config must be a dict (or its JSON), got {type(value).__name__}"
        )
    known = {f.name for f in fields(SpeculativeConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(
            f"speculative_config has unknown key(s) {unknown}; known keys: {sorted(known)}"
        )
    options = dict(value)
    if "method" not in options:
        raise ValueError("speculative_config needs a method (e.g. 'ngram')")
    if "prompt_lookup_max" not in options and "prompt_lookup_min" in options:
        options["prompt_lookup_max"] = max(4, options["prompt_lookup_min"])
    return SpeculativeConfig(**options)


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"speculative_config.{name} must be an integer in [{low}, {high}], got {value!r}"
        )

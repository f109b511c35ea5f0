"""What a request's output must match: vLLM's ``StructuredOutputsParams``.

One of a JSON schema, any JSON object, a regular expression, a fixed list of choices, or a
Lark grammar. The built-in structured-output plugin (plugins/builtin/structured_output.py)
turns it into a token mask at every step; here the values are only checked, so a bad
request fails with a ValueError naming the field before anything is compiled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loragate.plugins import InvalidParam

# Compiling a grammar costs time on the engine thread: bound what one request may send.
MAX_SPEC_CHARS = 64 * 1024
MAX_CHOICES = 1024

_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    """Exactly one of: ``json`` (a JSON schema, as a dict or its JSON text), ``regex``,
    ``choice`` (a list of strings), ``grammar`` (Lark syntax), or ``json_object=True``."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise InvalidParam(
                "structured_outputs",
                "structured_outputs takes exactly one of json, regex, choice, grammar or "
                f"json_object, got {given or 'none'}",
            )
        if self.json_object not in (None, True, False):
            raise InvalidParam(
                "structured_outputs", f"json_object must be true or false, got {self.json_object!r}"
            )
        if isinstance(self.json, str):
            self.json = _parse_schema(self.json)
        if self.json is not None:
            if not isinstance(self.json, dict):
                raise InvalidParam(
                    "structured_outputs",
                    f"structured_outputs.json must be a JSON schema object, got "
                    f"{type(self.json).__name__}",
                )
            _bounded("json", json.dumps(self.json))
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str) or not value:
                    raise InvalidParam(
                        "structured_outputs",
                        f"structured_outputs.{name} must be a non-empty string",
                    )
                _bounded(name, value)
        if self.choice is not None:
            _check_choices(self.choice)


# vLLM's older name for the same thing (`SamplingParams(guided_decoding=...)`).
GuidedDecodingParams = StructuredOutputsParams


def structured_outputs_from(value: Any) -> StructuredOutputsParams | None:
    """A dict (as plain data carries it) or the object itself."""
    if value is None or isinstance(value, StructuredOutputsParams):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(_KINDS))
        if unknown:
            raise InvalidParam(
                "structured_outputs", f"structured_outputs has unknown fields {unknown}"
            )
        return StructuredOutputsParams(**value)
    raise InvalidParam(
        "structured_outputs",
        f"structured_outputs must be a StructuredOutputsParams or a dict, got "
        f"{type(value).__name__}",
    )


def _parse_schema(text: str) -> Any:
    _bounded("json", text)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidParam(
            "structured_outputs", f"structured_outputs.json is not valid JSON: {exc}"
        ) from None


def _bounded(name: str, text: str) -> None:
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidParam(
            "structured_outputs",
            f"structured_outputs.{name} is {len(text)} characters; at most {MAX_SPEC_CHARS}",
        )


def _check_choices(choices: Any) -> None:
    if not isinstance(choices, list | tuple) or not choices:
        raise InvalidParam(
            "structured_outputs", "structured_outputs.choice must be a non-empty list of strings"
        )
    if len(choices) > MAX_CHOICES:
        raise InvalidParam(
            "structured_outputs",
            f"structured_outputs.choice has {len(choices)} entries; at most {MAX_CHOICES}",
        )
    if not all(isinstance(c, str) and c for c in choices):
        raise InvalidParam(
            "structured_outputs", "structured_outputs.choice must contain only non-empty strings"
        )
    _bounded("choice", json.dumps(list(choices)))

"""Each API's way of asking for structured output, as the engine's `structured_outputs`.

OpenAI's `response_format` (json_object, json_schema); vLLM's extra fields (`guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar`, and the newer `structured_outputs`);
TGI's `grammar` ({"type": "json" | "regex", "value"}) and LoRAX's `response_format`
({"type": "json_object", "schema"}). At most one per request; the engine checks the values.
"""

from __future__ import annotations

from typing import Any

from loragate.gateway.errors import InvalidRequestError

VLLM_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def openai_structured(req: Any) -> tuple[dict | None, str | None]:
    """(structured_outputs, the field that asked for it) of a completions or chat request."""
    asked: list[tuple[dict, str]] = []
    if req.response_format is not None:
        spec = _openai_response_format(req.response_format)
        if spec is not None:
            asked.append((spec, "response_format"))
    for name, kind in VLLM_FIELDS.items():
        value = getattr(req, name)
        if value is not None:
            asked.append(({kind: value}, name))
    if req.structured_outputs is not None:
        if not isinstance(req.structured_outputs, dict):
            raise InvalidRequestError(
                "structured_outputs must be an object", param="structured_outputs"
            )
        asked.append((req.structured_outputs, "structured_outputs"))
    return _one(asked)


def _openai_response_format(value: dict) -> dict | None:
    kind = value.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        wrapper = value.get("json_schema")
        if not isinstance(wrapper, dict) or not isinstance(wrapper.get("schema"), dict):
            raise InvalidRequestError(
                "response_format json_schema needs json_schema.schema, a JSON schema object",
                param="response_format",
            )
        return {"json": wrapper["schema"]}
    raise InvalidRequestError(
        f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format",
    )


def tgi_structured(p: Any) -> tuple[dict | None, str | None]:
    """TGI's `grammar` and LoRAX's `response_format`, as parameters.<field>."""
    asked: list[tuple[dict, str]] = []
    if p.grammar is not None:
        kind, value = p.grammar.get("type"), p.grammar.get("value")
        if kind not in ("json", "regex") or value is None:
            raise InvalidRequestError(
                "grammar must be {'type': 'json' | 'regex', 'value': ...}",
                param="parameters.grammar",
            )
        asked.append(({kind: value}, "parameters.grammar"))
    if p.response_format is not None:
        kind = p.response_format.get("type")
        if kind not in ("json_object", "json_schema", "json"):
            raise InvalidRequestError(
                f"response_format type must be 'json_object', got {kind!r}",
                param="parameters.response_format",
            )
        schema = p.response_format.get("schema")
        if schema is None and isinstance(p.response_format.get("json_schema"), dict):
            schema = p.response_format["json_schema"].get("schema")
        spec = {"json": schema} if schema is not None else {"json_object": True}
        asked.append((spec, "parameters.response_format"))
    return _one(asked)


def _one(asked: list[tuple[dict, str]]) -> tuple[dict | None, str | None]:
    if len(asked) > 1:
        names = ", ".join(name for _, name in asked)
        raise InvalidRequestError(
            f"ask for structured output one way only, got {names}", param=asked[1][1]
        )
    return asked[0] if asked else (None, None)

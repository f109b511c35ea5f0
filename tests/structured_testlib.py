"""JSON schemas whose every match is short: structured-output tests on any model end."""

from __future__ import annotations

COLOR = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "word": {"type": "string", "maxLength": 8},
    },
    "required": ["color", "ok", "word"],
    "additionalProperties": False,
}
POINT = {
    "type": "object",
    "properties": {
        "x": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["a", "b"]},
    },
    "required": ["x", "tag"],
    "additionalProperties": False,
}

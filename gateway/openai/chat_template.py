"""vLLM's `--chat-template`: a Jinja file, or the template's text itself, in place of the
model's own (for a model whose template lays out no tools, say)."""

from __future__ import annotations

from pathlib import Path

import jinja2


def load_chat_template(value: str | Path | None) -> str | None:
    """The template's text; ValueError naming the problem if it is neither a readable file
    nor a template that parses."""
    if value is None:
        return None
    text = str(value)
    path = Path(text).expanduser()
    looks_inline = any(mark in text for mark in ("{{", "{%"))
    if not looks_inline:
        if not path.is_file():
            raise ValueError(f"chat_template: no such file: {text}")
        text = path.read_text(encoding="utf-8")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat_template does not parse: {exc}") from exc
    return text

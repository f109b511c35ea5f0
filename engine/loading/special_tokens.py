"""Which special tokens a plain-text prompt gets: the rule the model file itself states.

transformers builds a GGUF model's tokenizer with a BOS post-processor whatever the file's
`tokenizer.ggml.add_bos_token` says, where llama.cpp and vLLM follow the flag. So the
converter reads the flags from the GGUF metadata, makes the tokenizer follow them and
records them beside the converted directory; an HF directory's rule is what transformers
reads from its tokenizer_config.json / post-processor. The engine then applies the rule
itself, which lets it skip a BOS (or EOS) that a text already carries: a chat-templated
text never gets a second one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import processors

GGUF_FLAG_KEYS = {
    "add_bos_token": "tokenizer.ggml.add_bos_token",
    "add_eos_token": "tokenizer.ggml.add_eos_token",
}
GGUF_ID_KEYS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
}
SOURCE_RECORD = "loragate_source.json"  # written beside a converted GGUF's HF directory
_PROBE = "a"


@dataclass(frozen=True)
class SpecialTokenRule:
    """Token ids put before (`prefix`) and after (`suffix`) a plain-text prompt."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    source: str

    def apply(self, ids: list[int]) -> list[int]:
        """`ids` with the rule's tokens, never a second copy of ones they already carry."""
        head = [] if tuple(ids[: len(self.prefix)]) == self.prefix else list(self.prefix)
        has_tail = not self.suffix or tuple(ids[-len(self.suffix) :]) == self.suffix
        return head + list(ids) + ([] if has_tail else list(self.suffix))

    def describe(self, tokenizer) -> str:
        bos = f"BOS {_names(tokenizer, self.prefix)}" if self.prefix else "no BOS"
        eos = f"EOS {_names(tokenizer, self.suffix)}" if self.suffix else "no EOS"
        return f"plain-text prompts get {bos} and {eos}, as said by {self.source}"


def read_gguf_rule(gguf: Path) -> dict:
    """The file's add_bos_token / add_eos_token flags (None where the key is absent) and
    its BOS / EOS ids, as JSON-ready values."""
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    rule: dict = {"gguf": str(gguf.resolve())}
    for name, key in GGUF_FLAG_KEYS.items():
        rule[name] = bool(fields[key].contents()) if key in fields else None
    for name, key in GGUF_ID_KEYS.items():
        rule[name] = int(fields[key].contents()) if key in fields else None
    return rule


def follow_gguf_rule(tokenizer, rule: dict) -> None:
    """Make the tokenizer (and what `save_pretrained` writes of it) add exactly the tokens
    that the GGUF flags ask for; a flag the file lacks leaves transformers' choice."""
    prefix, suffix = added_tokens(tokenizer)
    want_prefix = _wanted(prefix, rule["add_bos_token"], rule["bos_token_id"], "BOS", rule)
    want_suffix = _wanted(suffix, rule["add_eos_token"], rule["eos_token_id"], "EOS", rule)
    if (want_prefix, want_suffix) == (prefix, suffix):
        return
    # Llama-style tokenizers save these flags to tokenizer_config.json and rebuild their
    # post-processor from them when loaded; their public setters would rebuild it here from
    # `bos_token`, which need not be the id the file names, so the template is built below.
    if hasattr(tokenizer, "_add_bos_token"):
        tokenizer._add_bos_token = bool(want_prefix)
        tokenizer._add_eos_token = bool(want_suffix)
    backend = tokenizer.backend_tokenizer
    old = backend.post_processor
    ids = dict.fromkeys(want_prefix + want_suffix)
    template = processors.TemplateProcessing(
        single=[f"{_token(tokenizer, i)}:0" for i in want_prefix]
        + ["$A:0"]
        + [f"{_token(tokenizer, i)}:0" for i in want_suffix],
        special_tokens=[(_token(tokenizer, i), i) for i in ids],
    )
    kept = [old] if isinstance(old, processors.ByteLevel) else []  # offsets only, no tokens
    backend.post_processor = processors.Sequence([*kept, template]) if kept else template
    if added_tokens(tokenizer) != (want_prefix, want_suffix):
        raise ValueError(
            f"cannot make the {type(tokenizer).__name__} of {rule['gguf']} follow its "
            f"add_bos_token={rule['add_bos_token']} / add_eos_token={rule['add_eos_token']}"
        )


def recorded_gguf_rule(hf_dir: Path) -> dict | None:
    """The GGUF rule recorded in a converted directory, if it is one."""
    record = Path(hf_dir) / SOURCE_RECORD
    if not record.is_file():
        return None
    return json.loads(record.read_text()).get("special_tokens")


def special_token_rule(tokenizer, tokenizer_dir: Path) -> SpecialTokenRule:
    """What the loaded tokenizer adds, and which file said so."""
    prefix, suffix = added_tokens(tokenizer)
    return SpecialTokenRule(prefix, suffix, _source(Path(tokenizer_dir)))


def added_tokens(tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) ids that `encode(..., add_special_tokens=True)` puts around a text."""
    plain = tokenizer.encode(_PROBE, add_special_tokens=False)
    full = tokenizer.encode(_PROBE, add_special_tokens=True)
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return tuple(full[:start]), tuple(full[start + len(plain) :])
    raise ValueError(
        f"the {type(tokenizer).__name__} does more than add tokens around a prompt "
        f"({plain} becomes {full}); loragate cannot follow its rule"
    )


def _wanted(current: tuple, flag: bool | None, token_id: int | None, what: str, rule: dict):
    if flag is None:
        return current
    if not flag:
        return ()
    if token_id is None:
        raise ValueError(f"{rule['gguf']} asks for a {what} token but names none")
    return (token_id,)


def _source(tokenizer_dir: Path) -> str:
    gguf_rule = recorded_gguf_rule(tokenizer_dir)
    if gguf_rule is not None:
        flags = ", ".join(
            f"{key}={'absent' if gguf_rule[name] is None else gguf_rule[name]}"
            for name, key in GGUF_FLAG_KEYS.items()
        )
        return f"the GGUF metadata of {gguf_rule['gguf']} ({flags}), recorded in {tokenizer_dir}"
    config_file = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    flags = {k: config[k] for k in ("add_bos_token", "add_eos_token") if k in config}
    if flags:
        return f"{config_file} ({', '.join(f'{k}={v}' for k, v in flags.items())})"
    return f"the post-processor of {tokenizer_dir / 'tokenizer.json'}"


def _token(tokenizer, token_id: int) -> str:
    return tokenizer.convert_ids_to_tokens(token_id)


def _names(tokenizer, ids: tuple[int, ...]) -> str:
    return ", ".join(f"{_token(tokenizer, i)} (id {i})" for i in ids)

"""Module-name patterns from adapter_config.json, matched in time linear in the name.

`rank_pattern`, `alpha_pattern` and a regex `target_modules` come from the adapter's
author, who may be any tenant. Python's `re` backtracks (a crafted pattern can take
seconds per module, holding the GIL, so every thread stalls), so they are compiled with
RE2 (google-re2), whose matching is linear and whose programs are bounded in memory.
RE2 has no look-around or back-references: a pattern using them is refused with a clear
error; the patterns PEFT writes (module names, `layers\\.\\d+` style regexes) all fit.
"""

from __future__ import annotations

import re2

# Patterns are short in real adapters; a bound keeps compiling cheap too.
MAX_PATTERN_CHARS = 1024
# RE2's budget for one compiled program (its default is 8 MiB).
MAX_PROGRAM_BYTES = 1 << 20

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the client's error, not a log line
_OPTIONS.max_mem = MAX_PROGRAM_BYTES


class PatternError(ValueError):
    """A pattern that is too long or that RE2 cannot compile (say why)."""


def compile_pattern(pattern: str, *, anchored_suffix: bool = False):
    """The RE2 program for ``pattern``; with ``anchored_suffix`` it matches when the pattern
    matches the whole name or its end after a dot, as PEFT's ``rank_pattern`` keys do."""
    if not isinstance(pattern, str) or not pattern:
        raise PatternError(f"a pattern must be a non-empty string, got {pattern!r}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"a pattern must be at most {MAX_PATTERN_CHARS} characters")
    source = rf"(.*\.)?({pattern})$" if anchored_suffix else pattern
    try:
        return re2.compile(source, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(
            f"invalid regex {_shown(pattern)}: {reason} (module-name patterns are matched "
            "with RE2, in linear time: no look-around or back-references)"
        ) from exc


def first_suffix_match(patterns: dict, name: str) -> str | None:
    """The first pattern (a key of ``patterns``) that matches ``name`` or its dotted end."""
    for pattern in patterns:
        if compile_pattern(pattern, anchored_suffix=True).match(name):
            return pattern
    return None


def _shown(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 80 else pattern[:80] + "...")

"""Which patterns reach Python's backtracking `re` while a block runs: the clock-free proof
that a tenant's module-name pattern is matched by RE2 (linear time) and never by `re`.

Every `re.compile`, `re.match`, `re.search`, `re.fullmatch`, `re.sub`, ... compiles its
pattern through `re._compile` (the compiled-pattern cache sits inside it), so wrapping that
one function sees every pattern `re` is asked to run, from any thread. A backtracking bomb
stalls a process only if `re` runs it; a test that shows `re` never saw it, and that the
pattern was matched all the same, needs no timing.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def patterns_seen_by_python_re(*fragments: str) -> Iterator[list[str]]:
    """Within the block, the list of patterns given to Python's `re` that contain any of
    `fragments` (checked while the block runs and after it)."""
    seen: list[str] = []
    lock = threading.Lock()
    original = re._compile

    def watched(pattern, flags):
        text = pattern if isinstance(pattern, str) else getattr(pattern, "pattern", "")
        if isinstance(text, str) and any(fragment in text for fragment in fragments):
            with lock:
                seen.append(text)
        return original(pattern, flags)

    re._compile = watched
    try:
        yield seen
    finally:
        re._compile = original

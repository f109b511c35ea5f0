"""How deeply a JSON text nests, found without parsing it.

Parsers recurse per level (Python's json and msgspec both end in RecursionError near a
thousand levels), so text from a client or an adapter author is measured first and refused
past a documented depth, with a clear error instead of a traceback.
"""

from __future__ import annotations

import re
from itertools import accumulate

# Request bodies and adapter_config.json alike: real ones nest under ten levels.
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def json_depth(text: bytes | str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets in strings skipped).

    Linear time; for malformed text it is an upper bound, which is all a limit needs."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def too_deep(text: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when ``text`` nests deeper than ``limit``; text with few brackets is not scanned."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    return json_depth(data) > limit

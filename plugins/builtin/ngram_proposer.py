"""Built-in speculative proposer: prompt lookup (vLLM's "ngram" method).

For each row, the longest n-gram (from `prompt_lookup_max` down to `prompt_lookup_min`
tokens) that ends the row's tokens and also occurs earlier in them is looked up; the tokens
that followed its latest earlier occurrence are proposed. Rows that copy from their prompt
(edits, quotes, code) get long accepted runs; rows with nothing to copy get no proposal and
cost nothing more. Plain data in and out, as every proposer hook.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from loragate.plugins.markers import hookimpl


def propose_ngram(rows: list[dict], options: dict) -> list[list[int]]:
    """One proposal per row (possibly empty): row["token_ids"] are its tokens so far
    (prompt and output), row["max_tokens"] the most it may propose."""
    low, high = options.get("prompt_lookup_min", 1), options.get("prompt_lookup_max", 4)
    return [lookup(row["token_ids"], row["max_tokens"], low, high) for row in rows]


def lookup(token_ids: list[int], k: int, low: int, high: int) -> list[int]:
    """The up to `k` tokens after the latest earlier occurrence of the longest suffix
    n-gram of `token_ids` (low <= n <= high); [] when none occurs."""
    length = len(token_ids)
    if k <= 0 or length < low + 1:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(high, length - 1), low - 1, -1):
        # Windows starting at 0 .. length - n - 1: every occurrence before the suffix itself.
        windows = sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tokens[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    """Registered last: a plugin's proposer of the same name wins."""

    @hookimpl(trylast=True)
    def loragate_speculative_proposers(self):
        return {"ngram": propose_ngram}

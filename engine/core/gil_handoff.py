"""How soon the engine thread gets the GIL back: a running engine shortens the switch interval.

An AsyncLLMEngine runs three threads that take turns at the GIL: the engine thread, which
releases it in each of a step's hundreds of torch calls and needs it back after each; the
output thread, which detokenizes a step's tokens while the next step computes; and the event
loop (HTTP, SSE, admission), beside adapter loader threads parsing files. A thread that
wants the GIL while another runs Python waits for the holder to drop it, which the
interpreter asks for only after its switch interval, 5 ms by default. Each of the step's
torch calls can wait that long: measured on a 2-core AMD EPYC (2026-11-27, bf16, 64
streaming requests of 96 tokens into an AsyncLLMEngine, best of 3), 552-570 tok/s at 5 ms
against 595-607 at 0.5 ms; and a decode step beside paced rank-64 adapter loads ran 46-49 ms
at 5 ms against 39 ms at 0.5 ms.

So while an engine runs, the interval is SWITCH_INTERVAL_S (never made longer than it was);
when the last engine of the process stops it is set back. The interval belongs to the
process, so the count of running engines does too.
"""

from __future__ import annotations

import logging
import sys
import threading

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_running = 0
_before: float | None = None


def engine_started() -> None:
    """An engine starts its threads: the GIL changes hands after SWITCH_INTERVAL_S at most."""
    global _running, _before
    with _lock:
        _running += 1
        if _running == 1 and sys.getswitchinterval() > SWITCH_INTERVAL_S:
            _before = sys.getswitchinterval()  # set back only what this changed
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            log.info("GIL switch interval %.1f ms while the engine runs", 1e3 * SWITCH_INTERVAL_S)


def engine_stopped() -> None:
    """An engine stopped: when it was the last one running, the interval is as it was."""
    global _running, _before
    with _lock:
        if _running == 0:
            return
        _running -= 1
        if _running == 0 and _before is not None:
            sys.setswitchinterval(_before)
            _before = None

"""The hooks a loragate plugin may implement.

Every hook takes and returns plain data (dicts, lists, ints, strings) and tensors, never
engine objects, so a plugin needs no engine internals. ``docs/plugins.md`` documents each
one with an example (a test keeps the two in step).
"""

from __future__ import annotations

from loragate.plugins.markers import hookspec


@hookspec
def loragate_samplers():
    """Return ``{name: sampler}``; ``sampler(logits[n, vocab], args: list[dict]) -> ids[n]``."""


@hookspec
def loragate_logits_processors(params, model):
    """Return processors ``(output_token_ids, logits[vocab]) -> logits`` for one request."""


@hookspec
def loragate_decoding_strategies():
    """Return ``{name: strategy}``, each with ``start``/``step``/``finish`` (see docs)."""


@hookspec
def loragate_speculative_proposers():
    """Return ``{name: proposer}``; ``proposer(rows, options)`` -> token ids per row."""


@hookspec(firstresult=True)
def loragate_choose_adapter_victim(candidates, tier):
    """firstresult: return the ``key`` of the adapter to evict from ``tier`` (device/cpu)."""


@hookspec(firstresult=True)
def loragate_choose_preemption_victim(running):
    """firstresult: return the ``request_id`` of the running sequence group to preempt."""


@hookspec(firstresult=True)
def loragate_preempt_for_waiting(waiting, running, tenants, policy):
    """firstresult: return the ``request_id`` to preempt so ``waiting`` may run, or None."""


@hookspec(firstresult=True)
def loragate_order_waiting(waiting, tenants, policy):
    """firstresult: return the ``seq_id`` of every ``waiting`` entry, in admission order."""


@hookspec
def loragate_request_started(info):
    """Observe a request entering the engine; exceptions are logged, never raised."""


@hookspec
def loragate_request_finished(info):
    """Observe a request leaving the engine; exceptions are logged, never raised."""

"""Policy hooks (adapter eviction, preemption), observers and describe(): each answer is
checked and a bad one names the plugin."""

from __future__ import annotations

import logging

import plugins_testlib as lib
import pytest

from loragate.plugins import PluginError, PluginManager, hookimpl


def manager(*plugins) -> PluginManager:
    return PluginManager.create(plugins=list(plugins), load_entrypoints=False)


def adapter(name, last_used, size_bytes=100, pinned=False):
    return {
        "key": (name, last_used, f"/adapters/{name}"),
        "name": name,
        "tenant": None,
        "last_used": last_used,
        "uses": 1,
        "size_bytes": size_bytes,
        "pinned": pinned,
    }


def group(request_id, admitted_order):
    return {
        "request_id": request_id,
        "seq_id": admitted_order,
        "arrival_time": float(admitted_order),
        "num_prompt_tokens": 5,
        "num_output_tokens": 2,
        "num_blocks": 1,
        "lora_name": None,
        "admitted_order": admitted_order,
    }


def test_builtin_adapter_eviction_is_lru_skipping_pinned():
    plugins = manager()
    candidates = [adapter("a", 5), adapter("b", 2, pinned=True), adapter("c", 3), adapter("d", 9)]
    assert plugins.choose_adapter_victim(candidates, "device") == ("c", 3, "/adapters/c")
    everything_pinned = [adapter("a", 5, pinned=True), adapter("b", 2, pinned=True)]
    assert plugins.choose_adapter_victim(everything_pinned, "cpu") == ("b", 2, "/adapters/b")


def test_third_party_eviction_policy_wins_over_lru():
    candidates = [adapter("small", 1, size_bytes=10), adapter("big", 9, size_bytes=1000)]
    assert manager().choose_adapter_victim(candidates, "cpu")[0] == "small"
    plugins = manager(lib.LargestAdapterFirst())
    assert plugins.choose_adapter_victim(candidates, "cpu")[0] == "big"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (["a", 5, "/adapters/a"], ("a", 5, "/adapters/a")),  # a key that went through JSON
        ("a", ("a", 5, "/adapters/a")),  # a unique name
        ({"key": ("b", 2, "/adapters/b")}, ("b", 2, "/adapters/b")),  # the candidate itself
    ],
)
def test_adapter_victim_answers_resolve_to_keys(answer, expected):
    class Answers:
        from loragate.plugins import hookimpl

        @hookimpl
        def loragate_choose_adapter_victim(self, candidates, tier):
            return answer

    plugins = manager(Answers())
    assert plugins.choose_adapter_victim([adapter("a", 5), adapter("b", 2)], "cpu") == expected


def test_bad_adapter_victim_answer_names_the_plugin():
    class Answers:
        from loragate.plugins import hookimpl

        @hookimpl
        def loragate_choose_adapter_victim(self, candidates, tier):
            return "zzz"

    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(Answers(), name="evictor")
    with pytest.raises(PluginError, match="plugin 'evictor'.*returned 'zzz'.*not a candidate"):
        plugins.choose_adapter_victim([adapter("a", 5)], "device")


def test_adapter_victim_checks_its_arguments():
    with pytest.raises(ValueError, match="tier must be one of"):
        manager().choose_adapter_victim([adapter("a", 1)], "disk")
    with pytest.raises(ValueError, match="non-empty list"):
        manager().choose_adapter_victim([], "cpu")


def test_builtin_preemption_is_newest_first_and_a_plugin_can_change_it():
    running = [group("r-old", 0), group("r-new", 2), group("r-mid", 1)]
    assert manager().choose_preemption_victim(running) == "r-new"
    assert manager(lib.OldestFirstPreemption()).choose_preemption_victim(running) == "r-old"
    assert manager(lib.Abstains()).choose_preemption_victim(running) == "r-new"


def test_failing_policy_is_a_plugin_error_naming_it():
    class Crashes:
        from loragate.plugins import hookimpl

        @hookimpl
        def loragate_choose_preemption_victim(self, running):
            return running[99]["request_id"]

    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(Crashes(), name="crashy")
    with pytest.raises(PluginError, match="plugin 'crashy' failed in .*IndexError"):
        plugins.choose_preemption_victim([group("r", 0)])


def test_preemption_answer_must_be_a_running_request():
    class Answers:
        from loragate.plugins import hookimpl

        @hookimpl
        def loragate_choose_preemption_victim(self, running):
            return "r-gone"

    with pytest.raises(PluginError, match="returned 'r-gone'"):
        manager(Answers()).choose_preemption_victim([group("r", 0)])


# -- observers -------------------------------------------------------------------------


def test_observers_see_requests_and_their_exceptions_are_logged_not_raised(caplog):
    recorder = lib.RecordingObserver()
    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(recorder, name="recorder")
    plugins.register(lib.FailingObserver(), name="meter")
    info = {"request_id": "r1", "lora_name": "sql", "tenant": "acme"}
    with caplog.at_level(logging.ERROR, logger="loragate.plugins"):
        plugins.request_started(info)
        plugins.request_finished(info)
    assert recorder.events == [("started", info), ("finished", info)]
    failures = [r for r in caplog.records if "meter" in r.getMessage()]
    assert [r.getMessage() for r in failures] == [
        "plugin 'meter' failed in loragate_request_started (ignored)",
        "plugin 'meter' failed in loragate_request_finished (ignored)",
    ]
    assert all(r.exc_info and "meter offline" in str(r.exc_info[1]) for r in failures)


def test_describe_lists_builtins_and_plugins_with_their_hooks():
    described = manager(lib.RecordingObserver()).describe()
    assert described[:3] == [
        {"name": "builtin.samplers", "source": "builtin", "hooks": ["loragate_samplers"]},
        {
            "name": "builtin.lru_eviction",
            "source": "builtin",
            "hooks": ["loragate_choose_adapter_victim"],
        },
        {
            "name": "builtin.newest_first_preemption",
            "source": "builtin",
            "hooks": ["loragate_choose_preemption_victim"],
        },
    ]
    assert described[-1] == {
        "name": "plugins_testlib:RecordingObserver",
        "source": "explicit",
        "hooks": ["loragate_request_finished", "loragate_request_started"],
    }


def test_managers_are_independent():
    first = manager(lib.LastTokenSamplers())
    assert "last" in first.samplers()
    assert "last" not in manager().samplers()


def waiting(seq_id, tenant, cost=10, priority=0):
    return {"seq_id": seq_id, "tenant": tenant, "cost": cost, "priority": priority}


def test_builtin_fair_order_gives_a_weight_2_tenant_two_turns_to_one():
    """VTC: the least-served tenant's head goes next, and admitting it adds cost / weight
    to its counter; the order within a tenant stays as given; ties go to the earlier head."""
    entries = [waiting(i, "light") for i in range(4)] + [waiting(10 + i, "heavy") for i in range(4)]
    tenants = {"light": {"service": 0.0, "weight": 1.0}, "heavy": {"service": 0.0, "weight": 2.0}}
    order = manager().order_waiting(entries, tenants, "fair")
    assert order == [0, 10, 11, 1, 12, 13, 2, 3]
    behind = {"light": {"service": 0.0, "weight": 1.0}, "heavy": {"service": 25.0, "weight": 1.0}}
    assert manager().order_waiting(entries, behind, "fair")[:3] == [0, 1, 2]


def test_builtin_orders_for_fcfs_shortest_prefill_and_priority():
    entries = [waiting(1, "a", priority=3), waiting(2, "b", priority=0), waiting(3, "a")]
    plugins = manager()
    assert plugins.order_waiting(entries, {}, "fcfs") == [1, 2, 3]
    assert plugins.order_waiting(entries, {}, "shortest_prefill") == [1, 2, 3]
    assert plugins.order_waiting(entries, {}, "priority") == [2, 3, 1]


class DropsOne:
    @hookimpl
    def loragate_order_waiting(self, waiting):
        return [entry["seq_id"] for entry in waiting[1:]]


def test_an_order_that_is_not_every_seq_id_once_names_the_plugin():
    entries = [waiting(1, "a"), waiting(2, "b")]
    with pytest.raises(PluginError, match="DropsOne|must return every waiting seq_id"):
        manager(DropsOne()).order_waiting(entries, {}, "fcfs")
    with pytest.raises(ValueError, match="waiting must be a list of dicts"):
        manager().order_waiting([{"tenant": "a"}], {}, "fcfs")

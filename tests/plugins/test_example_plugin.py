"""examples/plugins, installed with pip, is found through its entry point and works."""

from __future__ import annotations

import pytest
import torch

from loragate.plugins import PluginError, PluginManager


def candidate(name, size_bytes, last_used, pinned=False):
    return {
        "key": (name, last_used, f"/adapters/{name}"),
        "name": name,
        "tenant": None,
        "last_used": last_used,
        "uses": 3,
        "size_bytes": size_bytes,
        "pinned": pinned,
    }


CANDIDATES = [
    candidate("old-small", 1_000, last_used=1),
    candidate("big-pinned", 90_000, last_used=2, pinned=True),
    candidate("new-big", 50_000, last_used=9),
    candidate("mid", 50_000, last_used=5),
]


def test_installed_example_is_discovered_through_its_entry_point(example_plugin_installed):
    plugins = PluginManager.create()
    described = {entry["name"]: entry for entry in plugins.describe()}
    assert described["example"] == {
        "name": "example",
        "source": "entry point loragate_example_plugin",
        "hooks": ["loragate_choose_adapter_victim", "loragate_samplers"],
    }
    assert plugins.sampler("logit_bias_greedy").plugin_name == "example"


def test_example_sampler_adds_each_rows_bias(example_plugin_installed):
    plugins = PluginManager.create()
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [0.0, 3.0, 1.0, 2.0]])
    args = [{"bias": {"2": 2.5}}, {}]  # JSON-style string keys
    assert plugins.call_sampler("logit_bias_greedy", logits, args).tolist() == [2, 1]


def test_example_sampler_failure_names_the_plugin(example_plugin_installed):
    plugins = PluginManager.create()
    with pytest.raises(PluginError, match="of plugin 'example' raised ValueError: bias token id 9"):
        plugins.call_sampler("logit_bias_greedy", torch.zeros(1, 4), [{"bias": {"9": 1.0}}])


def test_example_eviction_policy_replaces_lru(example_plugin_installed):
    assert PluginManager.create(load_entrypoints=False).choose_adapter_victim(
        CANDIDATES, "cpu"
    ) == ("old-small", 1, "/adapters/old-small")
    plugins = PluginManager.create()
    # Largest unpinned first; of two equally large, the least recently used.
    assert plugins.choose_adapter_victim(CANDIDATES, "device") == ("mid", 5, "/adapters/mid")


def test_allow_list_filters_the_example(example_plugin_installed, monkeypatch):
    monkeypatch.setenv("LORAGATE_PLUGINS", "example")
    assert "logit_bias_greedy" in PluginManager.create().samplers()
    monkeypatch.setenv("LORAGATE_PLUGINS", "someone-else")
    with pytest.raises(ValueError, match="no installed package provides"):
        PluginManager.create()
    monkeypatch.setenv("LORAGATE_PLUGINS", "")
    plugins = PluginManager.create()
    assert "logit_bias_greedy" not in plugins.samplers()
    assert plugins.choose_adapter_victim(CANDIDATES, "cpu")[0] == "old-small"

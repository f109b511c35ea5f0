"""PluginManager: discovery, allow-list, load errors, precedence, and error attribution."""

from __future__ import annotations

import plugins_testlib as lib
import pytest
import torch

from loragate.plugins import NamedHook, PluginError, PluginLoadError, PluginManager

GOOD_MODULE = """
    import torch
    from loragate.plugins import hookimpl

    def constant_seven(logits, args):
        return torch.full((logits.shape[0],), 7, dtype=torch.long)

    class Plugin:
        @hookimpl
        def loragate_samplers(self):
            return {"seven": constant_seven}
"""

BROKEN_MODULE = """
    import a_dependency_nobody_installed
"""


def manager(*plugins) -> PluginManager:
    return PluginManager.create(plugins=list(plugins), load_entrypoints=False)


# -- discovery -------------------------------------------------------------------------


def test_entry_point_plugin_is_discovered_and_used(install_fake_plugin):
    install_fake_plugin("fake-seven", {"seven": "fake_seven:Plugin"}, {"fake_seven": GOOD_MODULE})
    plugins = PluginManager.create()
    assert plugins.sampler("seven").plugin_name == "seven"
    tokens = plugins.call_sampler("seven", torch.zeros(2, 10), [{}, {}])
    assert tokens.tolist() == [7, 7]
    described = {entry["name"]: entry for entry in plugins.describe()}
    assert described["seven"]["hooks"] == ["loragate_samplers"]
    assert described["seven"]["source"] == "entry point fake_seven:Plugin"
    assert described["builtin.samplers"]["source"] == "builtin"


def test_load_entrypoints_false_skips_entry_points(install_fake_plugin):
    install_fake_plugin("fake-seven", {"seven": "fake_seven:Plugin"}, {"fake_seven": GOOD_MODULE})
    plugins = PluginManager.create(load_entrypoints=False)
    assert "seven" not in plugins.samplers()


def test_allow_list_from_environment_filters_entry_points(install_fake_plugin, monkeypatch):
    install_fake_plugin(
        "fake-two",
        {"seven": "fake_seven:Plugin", "broken": "fake_broken:Plugin"},
        {"fake_seven": GOOD_MODULE, "fake_broken": BROKEN_MODULE},
    )
    monkeypatch.setenv("LORAGATE_PLUGINS", " seven ")
    plugins = PluginManager.create()  # the broken plugin is never imported
    names = [entry["name"] for entry in plugins.describe()]
    assert "seven" in names and "broken" not in names
    monkeypatch.setenv("LORAGATE_PLUGINS", "")
    names = [entry["name"] for entry in PluginManager.create().describe()]
    assert "seven" not in names and all(name.startswith("builtin.") for name in names)


def test_allow_argument_wins_over_environment(install_fake_plugin, monkeypatch):
    install_fake_plugin("fake-seven", {"seven": "fake_seven:Plugin"}, {"fake_seven": GOOD_MODULE})
    monkeypatch.setenv("LORAGATE_PLUGINS", "something-else")
    plugins = PluginManager.create(allow=["seven"])
    assert "seven" in plugins.samplers()


def test_allow_list_naming_an_uninstalled_plugin_is_an_error(install_fake_plugin, monkeypatch):
    install_fake_plugin("fake-seven", {"seven": "fake_seven:Plugin"}, {"fake_seven": GOOD_MODULE})
    monkeypatch.setenv("LORAGATE_PLUGINS", "seven,sevn")
    with pytest.raises(PluginLoadError, match="'sevn'.*which no installed package provides"):
        PluginManager.create()


def test_entry_point_that_fails_to_import_stops_startup_naming_it(install_fake_plugin):
    install_fake_plugin(
        "fake-broken", {"broken": "fake_broken:Plugin"}, {"fake_broken": BROKEN_MODULE}
    )
    with pytest.raises(PluginLoadError) as caught:
        PluginManager.create()
    message = str(caught.value)
    assert message.startswith("plugin 'broken' (fake_broken:Plugin) failed to import: ")
    assert "a_dependency_nobody_installed" in message
    assert caught.value.plugin_name == "broken"
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("reference", "detail"),
    [
        ("plugins_testlib:NoSuchThing", "has no attribute 'NoSuchThing'"),
        ("no_such_plugin_module:Plugin", "No module named 'no_such_plugin_module'"),
    ],
)
def test_explicit_reference_that_fails_to_import_names_it(reference, detail):
    with pytest.raises(PluginLoadError) as caught:
        manager(reference)
    assert str(caught.value).startswith(f"plugin {reference!r} ({reference}) failed to import: ")
    assert detail in str(caught.value)


def test_explicit_reference_loads_and_instantiates_a_class():
    plugins = manager("plugins_testlib:LastTokenSamplers")
    assert plugins.sampler("last").plugin_name == "plugins_testlib:LastTokenSamplers"
    assert plugins.call_sampler("last", torch.zeros(1, 5), [{}]).tolist() == [4]


def test_explicit_object_registers_once():
    plugin = lib.LastTokenSamplers()
    plugins = manager(plugin, plugin)
    names = [entry["name"] for entry in plugins.describe()]
    assert names.count("plugins_testlib:LastTokenSamplers") == 1


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (lib.Unmarked(), "defines loragate_samplers\\(\\) without @hookimpl"),
        (lib.UnknownHook(), "'loragate_not_a_hook', which is not a loragate hook"),
        (lib.WrongArgument(), "is invalid: .*groups"),
        (lib.Wrapper(), "as a wrapper"),
    ],
)
def test_invalid_plugins_are_refused_by_name(plugin, message):
    with pytest.raises(PluginLoadError, match=message) as caught:
        manager(plugin)
    assert type(plugin).__name__ in caught.value.plugin_name


class SamplersHookRaises:
    from loragate.plugins import hookimpl

    @hookimpl
    def loragate_samplers(self):
        raise RuntimeError("config file missing")


class StrategyWithoutStep:
    from loragate.plugins import hookimpl

    @hookimpl
    def loragate_decoding_strategies(self):
        return {"half": object()}


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (SamplersHookRaises(), "failed in loragate_samplers: RuntimeError: config file missing"),
        (StrategyWithoutStep(), r"decoding strategy 'half' lacks method\(s\) \['start', 'step'"),
    ],
)
def test_broken_sampler_or_strategy_hooks_stop_startup_naming_the_plugin(plugin, message):
    with pytest.raises(PluginLoadError, match=message) as caught:
        manager(plugin)
    assert caught.value.plugin_name == f"test_plugin_manager:{type(plugin).__qualname__}"


def test_plugins_must_be_a_list():
    with pytest.raises(ValueError, match="plugins must be a list"):
        PluginManager.create(plugins="plugins_testlib:LastTokenSamplers")


# -- samplers --------------------------------------------------------------------------


def test_third_party_sampler_wins_over_builtin_of_the_same_name():
    assert manager().sampler("greedy").plugin_name == "builtin.samplers"
    plugins = manager(lib.GreedyOverride())
    assert plugins.samplers()["greedy"] == NamedHook(
        "plugins_testlib:GreedyOverride", lib.last_token_sampler
    )
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert plugins.call_sampler("greedy", logits, [{}]).tolist() == [2]
    assert plugins.call_sampler("random", logits, [{"temperature": 0}]).tolist() == [1]


def test_two_plugins_claiming_one_sampler_name_is_a_load_error():
    class Another(lib.LastTokenSamplers):
        pass

    with pytest.raises(PluginLoadError, match="sampler 'last' is provided by both"):
        manager(lib.LastTokenSamplers(), Another())


def test_unknown_sampler_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown sampler 'nope'; known samplers: \['greedy'"):
        manager().sampler("nope")
    with pytest.raises(ValueError, match="unknown sampler"):
        manager().call_sampler("nope", torch.zeros(1, 3), [{}])


class BadSampler:
    def __init__(self, sampler):
        self.sampler = sampler

    from loragate.plugins import hookimpl

    @hookimpl
    def loragate_samplers(self):
        return {"bad": self.sampler}


def _raises(logits, args):
    raise KeyError("temperature")


@pytest.mark.parametrize(
    ("sampler", "problem"),
    [
        (_raises, "raised KeyError: 'temperature'"),
        (lambda logits, args: [0], "returned list \\[0\\], not a tensor"),
        (lambda logits, args: torch.zeros(1, dtype=torch.long), "returned shape \\(1,\\)"),
        (lambda logits, args: torch.zeros(2), "returned dtype torch.float32"),
        (lambda logits, args: torch.tensor([0, 5]), "token id 5, outside the vocabulary"),
        (lambda logits, args: torch.tensor([-1, 0]), "token id -1, outside the vocabulary"),
    ],
)
def test_sampler_failures_are_plugin_errors_naming_the_plugin(sampler, problem):
    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(BadSampler(sampler), name="acme-sampler")
    with pytest.raises(PluginError, match=problem) as caught:
        plugins.call_sampler("bad", torch.zeros(2, 5), [{}, {}])
    assert caught.value.plugin_name == "acme-sampler"
    assert "sampler 'bad' of plugin 'acme-sampler'" in str(caught.value)


def test_call_sampler_checks_its_own_arguments():
    plugins = manager()
    with pytest.raises(ValueError, match="2-D tensor"):
        plugins.call_sampler("greedy", torch.zeros(5), [{}])
    with pytest.raises(ValueError, match="floating point"):
        plugins.call_sampler("greedy", torch.zeros(1, 5, dtype=torch.long), [{}])
    with pytest.raises(ValueError, match="list of 2 dicts"):
        plugins.call_sampler("greedy", torch.zeros(2, 5), [{}])


def test_integer_tokens_of_any_width_come_back_long():
    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(BadSampler(lambda logits, args: torch.tensor([3], dtype=torch.int32)))
    tokens = plugins.call_sampler("bad", torch.zeros(1, 5), [{}])
    assert tokens.dtype == torch.long and tokens.tolist() == [3]


# -- logits processors -------------------------------------------------------------------


def test_logits_processors_apply_per_request():
    plugins = manager(lib.BanToken())
    assert plugins.logits_processors({"sampler_args": None}) == []
    processors = plugins.logits_processors({"sampler_args": {"ban": 1}})
    assert [p.plugin_name for p in processors] == ["plugins_testlib:BanToken"]
    logits = plugins.apply_logits_processors(processors, [4], torch.tensor([0.0, 9.0, 1.0]))
    assert logits.tolist() == [0.0, float("-inf"), 1.0]


def test_bad_logits_processor_is_named():
    class Shrinks:
        from loragate.plugins import hookimpl

        @hookimpl
        def loragate_logits_processors(self, params):
            return [lambda ids, logits: logits[:1]]

    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(Shrinks(), name="shrinker")
    processors = plugins.logits_processors({})
    with pytest.raises(PluginError, match="of plugin 'shrinker' must return a float tensor"):
        plugins.apply_logits_processors(processors, [], torch.zeros(3))
    with pytest.raises(ValueError, match="params must be a dict"):
        plugins.logits_processors(None)


# -- policies --------------------------------------------------------------------------

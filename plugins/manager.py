"""The plugin manager the engine builds at start-up (one per engine, never a global).

It wraps pluggy's manager so that every call names the plugin at fault: hooks are called
one implementation at a time, in pluggy's order (tryfirst, then the most recently
registered, then trylast: the built-ins), and an exception or a bad return value becomes
a PluginError carrying ``plugin_name``. Hook wrappers are refused at registration, since
they would hide which plugin produced a result.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import pluggy
import torch

from loragate.plugins import hookspecs
from loragate.plugins.answers import (
    callable_name,
    check_marked,
    checked_tokens,
    default_name,
    describe,
    lookup,
    named_value_problem,
    spec_names,
)
from loragate.plugins.builtin import builtin_plugins
from loragate.plugins.builtin.eviction import victim_key
from loragate.plugins.errors import PluginError, PluginLoadError
from loragate.plugins.loading import discover_entry_points, load_entry_point, load_reference
from loragate.plugins.markers import PROJECT_NAME

logger = logging.getLogger(__name__)

ADAPTER_TIERS = ("device", "cpu")


class NamedHook(NamedTuple):
    """A sampler, processor or strategy together with the plugin that provided it."""

    plugin_name: str
    fn: Any


class PluginManager:
    """Loaded plugins and the calls the engine makes into them."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._sources: dict[str, str] = {}
        self._named_cache: dict[str, dict[str, NamedHook]] = {}

    @classmethod
    def create(
        cls,
        plugins: Iterable[object | str] = (),
        load_entrypoints: bool = True,
        allow: Iterable[str] | str | None = None,
    ) -> PluginManager:
        """The built-ins, the ``loragate.plugins`` entry points, then ``plugins``.

        ``allow`` (default: the ``LORAGATE_PLUGINS`` variable, comma-separated) limits
        which entry points load; ``plugins`` (objects, or "module:object" strings) always
        load. Any plugin that fails to import or register raises PluginLoadError.
        """
        if isinstance(plugins, str | bytes):
            raise ValueError(f"plugins must be a list of objects or strings, got {plugins!r}")
        manager = cls()
        for name, plugin in builtin_plugins():
            manager.register(plugin, name=name, source="builtin")
        if load_entrypoints:
            for entry_point in discover_entry_points(allow):
                plugin = load_entry_point(entry_point)
                manager.register(
                    plugin, name=entry_point.name, source=f"entry point {entry_point.value}"
                )
        for item in plugins:
            if isinstance(item, str):
                manager.register(load_reference(item), name=item, source=f"--plugin {item}")
            else:
                manager.register(item, source="explicit")
        try:  # collected once, now: a broken sampler or strategy hook stops start-up
            manager.samplers()
            manager.decoding_strategies()
        except PluginError as exc:
            raise PluginLoadError(exc.plugin_name, str(exc)) from exc
        return manager

    # -- registration -------------------------------------------------------------------
    def register(self, plugin: object, name: str | None = None, source: str = "explicit") -> str:
        """Register ``plugin`` (once: a second registration is ignored); returns its name."""
        if self._pm.is_registered(plugin):
            return self._pm.get_name(plugin)
        name = name or default_name(plugin)
        if self._pm.has_plugin(name):
            raise PluginLoadError(name, f"plugin {name!r} is registered twice")
        check_marked(name, plugin)
        try:
            self._pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            detail = "; ".join(str(exc).splitlines())
            raise PluginLoadError(name, f"plugin {name!r} is invalid: {detail}") from exc
        try:
            self._check_hooks(name, plugin)
        except PluginLoadError:
            self._pm.unregister(plugin)
            raise
        self._sources[name] = source
        self._named_cache.clear()
        return name

    def _check_hooks(self, name: str, plugin: object) -> None:
        for caller in self._pm.get_hookcallers(plugin) or ():
            if caller.spec is None:
                raise PluginLoadError(
                    name,
                    f"plugin {name!r} implements {caller.name!r}, which is not a loragate hook "
                    f"(known: {sorted(spec_names())})",
                )
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper):
                    raise PluginLoadError(
                        name,
                        f"plugin {name!r} implements {caller.name!r} as a wrapper, which "
                        "loragate does not support: return a result instead",
                    )

    def describe(self) -> list[dict]:
        """What is loaded, in registration order, and which hooks each plugin implements."""
        return [
            {
                "name": name,
                "source": self._sources.get(name, "explicit"),
                "hooks": sorted(caller.name for caller in self._pm.get_hookcallers(plugin) or ()),
            }
            for name, plugin in self._pm.list_name_plugin()
            if plugin is not None
        ]

    # -- samplers, strategies, processors -------------------------------------------------
    def samplers(self) -> dict[str, NamedHook]:
        """``{name: (plugin_name, sampler)}``; a plugin's sampler beats a built-in's."""
        return dict(self._named("loragate_samplers", "sampler"))

    def sampler(self, name: str) -> NamedHook:
        """The sampler called ``name``; ValueError naming the known ones otherwise."""
        return lookup(self._named("loragate_samplers", "sampler"), name, "sampler")

    def decoding_strategies(self) -> dict[str, NamedHook]:
        """``{name: (plugin_name, strategy)}``; a plugin's strategy beats a built-in's."""
        return dict(self._named("loragate_decoding_strategies", "decoding strategy"))

    def decoding_strategy(self, name: str) -> NamedHook:
        """The strategy called ``name``; ValueError naming the known ones otherwise."""
        strategies = self._named("loragate_decoding_strategies", "decoding strategy")
        return lookup(strategies, name, "decoding strategy")

    def proposer(self, name: str) -> NamedHook:
        """The speculative proposer called ``name``; ValueError naming the known ones."""
        proposers = self._named("loragate_speculative_proposers", "proposer")
        return lookup(proposers, name, "speculative proposer")

    def call_sampler(self, name: str, logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
        """Run sampler ``name`` and check its answer: a LongTensor[n] of in-vocabulary ids.

        Bad arguments from the caller raise ValueError; a sampler that raises or answers
        badly raises PluginError naming its plugin.
        """
        plugin_name, sampler = self.sampler(name)
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
            raise ValueError(f"logits must be a 2-D tensor [n, vocab], got {describe(logits)}")
        if not logits.is_floating_point():
            raise ValueError(f"logits must be floating point, got {logits.dtype}")
        if not isinstance(args, list) or len(args) != logits.shape[0]:
            raise ValueError(
                f"args must be a list of {logits.shape[0]} dicts (one per row), got {args!r}"
            )
        where = f"sampler {name!r} of plugin {plugin_name!r}"
        try:
            tokens = sampler(logits, args)
        except Exception as exc:
            raise PluginError(plugin_name, f"{where} raised {type(exc).__name__}: {exc}") from exc
        return checked_tokens(tokens, logits, plugin_name, where)

    def logits_processors(self, params: dict, model: dict | None = None) -> list[NamedHook]:
        """The processors plugins want applied to the request whose SamplingParams (as a
        dict) is ``params``, in hook call order. ``model``: the model's ``tokenizer``,
        ``vocab_size`` and ``eos_token_ids``. A plugin refuses the request's values by
        raising ValueError, which reaches the caller as it is (a 400 over HTTP)."""
        if not isinstance(params, dict):
            raise ValueError(f"params must be a dict (dataclasses.asdict), got {describe(params)}")
        processors = []
        hook = "loragate_logits_processors"
        for plugin_name, result in self._each(
            hook, params=params, model=model or {}, passthrough=(ValueError,)
        ):
            if not isinstance(result, list | tuple) or not all(map(callable, result)):
                raise PluginError(
                    plugin_name,
                    f"plugin {plugin_name!r}: loragate_logits_processors must return a list "
                    f"of callables, got {result!r}",
                )
            processors.extend(NamedHook(plugin_name, fn) for fn in result)
        return processors

    @staticmethod
    def apply_logits_processors(
        processors: list[NamedHook], output_token_ids: list[int], logits: torch.Tensor
    ) -> torch.Tensor:
        """``logits`` [vocab] after each processor in turn; PluginError names a bad one."""
        for plugin_name, processor in processors:
            try:
                result = processor(output_token_ids, logits)
            except Exception as exc:
                where = _processor_name(processor, plugin_name)
                raise PluginError(
                    plugin_name, f"{where} raised {type(exc).__name__}: {exc}"
                ) from exc
            if (
                not isinstance(result, torch.Tensor)
                or result.shape != logits.shape
                or not result.is_floating_point()
            ):
                raise PluginError(
                    plugin_name,
                    f"{_processor_name(processor, plugin_name)} must return a float tensor of "
                    f"shape {tuple(logits.shape)}, got {describe(result)}",
                )
            logits = result
        return logits

    # -- policies -----------------------------------------------------------------------
    def choose_adapter_victim(self, candidates: list[dict], tier: str):
        """The key of the adapter to evict from ``tier``, as the first plugin answering
        says (the built-in LRU answers last)."""
        if tier not in ADAPTER_TIERS:
            raise ValueError(f"tier must be one of {ADAPTER_TIERS}, got {tier!r}")
        if not isinstance(candidates, list) or not candidates:
            raise ValueError(f"candidates must be a non-empty list of dicts, got {candidates!r}")
        if not all(isinstance(c, dict) and "key" in c for c in candidates):
            raise ValueError("every candidate must be a dict with a 'key'")
        plugin_name, choice = self._first(
            "loragate_choose_adapter_victim", candidates=candidates, tier=tier
        )
        try:
            return victim_key(choice, candidates, tier)
        except ValueError as exc:
            raise PluginError(
                plugin_name, f"plugin {plugin_name!r}: loragate_choose_adapter_victim {exc}"
            ) from None

    def choose_preemption_victim(self, running: list[dict]):
        """The request_id of the sequence group to preempt (built-in: the newest)."""
        if not isinstance(running, list) or not running:
            raise ValueError(f"running must be a non-empty list of dicts, got {running!r}")
        if not all(isinstance(group, dict) and "request_id" in group for group in running):
            raise ValueError("every running group must be a dict with a 'request_id'")
        plugin_name, choice = self._first("loragate_choose_preemption_victim", running=running)
        if any(group["request_id"] == choice for group in running):
            return choice
        raise PluginError(
            plugin_name,
            f"plugin {plugin_name!r}: loragate_choose_preemption_victim returned {choice!r}, "
            "which is not the request_id of a running group",
        )

    def preempt_for_waiting(
        self, waiting: dict, running: list[dict], tenants: dict, policy: str
    ) -> str | None:
        """The request_id of a running group to preempt so the ``waiting`` entry may run,
        as the first plugin answering says; None when none answers (the built-in answers
        for ``fair`` and ``priority`` only, and only when one is owed)."""
        if not isinstance(waiting, dict) or "seq_id" not in waiting:
            raise ValueError(f"waiting must be a dict with a 'seq_id', got {waiting!r}")
        if not isinstance(running, list) or not all(
            isinstance(group, dict) and "request_id" in group for group in running
        ):
            raise ValueError("running must be a list of dicts, each with a 'request_id'")
        for plugin_name, choice in self._each(
            "loragate_preempt_for_waiting",
            waiting=waiting,
            running=running,
            tenants=tenants,
            policy=policy,
        ):
            if any(group["request_id"] == choice for group in running):
                return choice
            raise PluginError(
                plugin_name,
                f"plugin {plugin_name!r}: loragate_preempt_for_waiting returned {choice!r}, "
                "which is not the request_id of a running group",
            )
        return None

    def order_waiting(self, waiting: list[dict], tenants: dict, policy: str) -> list[int]:
        """The seq_ids of ``waiting`` in the order to admit them, as the first plugin
        answering for ``policy`` says (the built-ins answer fcfs, shortest_prefill,
        priority and fair). The answer must list every entry exactly once."""
        if not isinstance(waiting, list) or not all(
            isinstance(e, dict) and "seq_id" in e for e in waiting
        ):
            raise ValueError("waiting must be a list of dicts, each with a 'seq_id'")
        if not isinstance(tenants, dict):
            raise ValueError(f"tenants must be a dict, got {describe(tenants)}")
        plugin_name, order = self._first(
            "loragate_order_waiting", waiting=waiting, tenants=tenants, policy=policy
        )
        given = [e["seq_id"] for e in waiting]
        if (
            not isinstance(order, list | tuple)
            or not all(isinstance(i, int) for i in order)
            or sorted(order) != sorted(given)
        ):
            raise PluginError(
                plugin_name,
                f"plugin {plugin_name!r}: loragate_order_waiting must return every waiting "
                f"seq_id once ({len(given)} of them), got {order!r}",
            )
        return list(order)

    # -- observers ----------------------------------------------------------------------
    def request_started(self, info: dict) -> None:
        """Tell every observer; a failing observer is logged and skipped."""
        self._notify("loragate_request_started", info)

    def request_finished(self, info: dict) -> None:
        """Tell every observer; a failing observer is logged and skipped."""
        self._notify("loragate_request_finished", info)

    def _notify(self, hook_name: str, info: dict) -> None:
        for impl in self._impls(hook_name):
            try:
                impl.function(*[{"info": info}[arg] for arg in impl.argnames])
            except Exception:
                logger.exception("plugin %r failed in %s (ignored)", impl.plugin_name, hook_name)

    # -- calling hooks one implementation at a time -------------------------------------
    def _impls(self, hook_name: str) -> list:
        return list(reversed(getattr(self._pm.hook, hook_name).get_hookimpls()))

    def _each(self, hook_name: str, passthrough: tuple = (), **kwargs) -> Iterator[tuple[str, Any]]:
        """(plugin_name, result) of every implementation that returns something; exceptions
        of the ``passthrough`` types reach the caller unwrapped."""
        for impl in self._impls(hook_name):
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            except passthrough:
                raise
            except Exception as exc:
                raise PluginError(
                    impl.plugin_name,
                    f"plugin {impl.plugin_name!r} failed in {hook_name}: "
                    f"{type(exc).__name__}: {exc}",
                ) from exc
            if result is not None:
                yield impl.plugin_name, result

    def _first(self, hook_name: str, **kwargs) -> tuple[str, Any]:
        for answer in self._each(hook_name, **kwargs):
            return answer
        raise RuntimeError(f"no plugin answered {hook_name}")

    def _named(self, hook_name: str, kind: str) -> dict[str, NamedHook]:
        """Merge the ``{name: object}`` answers: the first in call order wins a name, and
        two plugins other than the built-ins may not claim the same one."""
        cached = self._named_cache.get(hook_name)
        if cached is not None:
            return cached
        merged: dict[str, NamedHook] = {}
        for plugin_name, result in self._each(hook_name):
            if not isinstance(result, dict):
                raise PluginError(
                    plugin_name,
                    f"plugin {plugin_name!r}: {hook_name} must return a dict "
                    f"{{name: {kind}}}, got {describe(result)}",
                )
            for name, value in result.items():
                if not isinstance(name, str) or not name:
                    raise PluginError(
                        plugin_name, f"plugin {plugin_name!r}: bad {kind} name {name!r}"
                    )
                problem = named_value_problem(kind, value)
                if problem:
                    raise PluginError(
                        plugin_name, f"plugin {plugin_name!r}: {kind} {name!r} {problem}"
                    )
                known = merged.get(name)
                if known is None:
                    merged[name] = NamedHook(plugin_name, value)
                elif self._sources.get(plugin_name) != "builtin":
                    raise PluginLoadError(
                        plugin_name,
                        f"{kind} {name!r} is provided by both plugin {known.plugin_name!r} and "
                        f"plugin {plugin_name!r}: disable one (LORAGATE_PLUGINS)",
                    )
        self._named_cache[hook_name] = merged
        return merged


def _processor_name(processor, plugin_name: str) -> str:
    """How an error names a logits processor (built only when one fails: this runs per
    request and step)."""
    return f"logits processor {callable_name(processor)} of plugin {plugin_name!r}"

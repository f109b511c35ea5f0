"""What the plugin manager checks of plugins and of what they answer, each check naming
the plugin at fault."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch

from loragate.plugins import hookspecs
from loragate.plugins.decoding import STRATEGY_METHODS
from loragate.plugins.errors import PluginError, PluginLoadError
from loragate.plugins.markers import PROJECT_NAME

HOOK_PREFIX = "loragate_"


def named_value_problem(kind: str, value) -> str | None:
    if kind in ("sampler", "proposer"):
        return None if callable(value) else "is not callable"
    missing = [m for m in STRATEGY_METHODS if not callable(getattr(value, m, None))]
    return f"lacks method(s) {missing}" if missing else None


def lookup(named: dict[str, tuple], name: str, kind: str) -> tuple:
    found = named.get(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"unknown {kind} {name!r}; known {kind}s: {sorted(named)}")
    return found


def checked_tokens(tokens, logits: torch.Tensor, plugin_name: str, where: str) -> torch.Tensor:
    rows, vocab = logits.shape
    if not isinstance(tokens, torch.Tensor):
        problem = f"returned {describe(tokens)}, not a tensor"
    elif tokens.shape != (rows,):
        problem = f"returned shape {tuple(tokens.shape)}, expected ({rows},)"
    elif tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        problem = f"returned dtype {tokens.dtype}, expected an integer dtype"
    elif rows and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        bad = int(tokens.min()) if int(tokens.min()) < 0 else int(tokens.max())
        problem = f"returned token id {bad}, outside the vocabulary [0, {vocab})"
    else:
        return tokens.to(device=logits.device, dtype=torch.long)
    raise PluginError(plugin_name, f"{where} {problem}")


def spec_names() -> set[str]:
    return {name for name in vars(hookspecs) if name.startswith(HOOK_PREFIX)}


def check_marked(name: str, plugin: object) -> None:
    """A ``loragate_*`` function without ``@hookimpl`` would silently never run."""
    marker = f"{PROJECT_NAME}_impl"
    for attr in dir(plugin):
        if not attr.startswith(HOOK_PREFIX):
            continue
        value = inspect.getattr_static(plugin, attr, None)
        value = getattr(value, "__func__", value)
        if callable(value) and not hasattr(value, marker):
            raise PluginLoadError(
                name,
                f"plugin {name!r} defines {attr}() without @hookimpl "
                "(from loragate.plugins import hookimpl)",
            )


def default_name(plugin: object) -> str:
    if inspect.ismodule(plugin):
        return plugin.__name__
    kind = plugin if inspect.isclass(plugin) or inspect.isfunction(plugin) else type(plugin)
    return f"{kind.__module__}:{kind.__qualname__}"


def callable_name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:200]

"""Finding plugin objects: entry points, "module:object" strings, and the allow-list."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os

from loragate.plugins.errors import PluginLoadError

ENTRY_POINT_GROUP = "loragate.plugins"
ALLOW_ENV = "LORAGATE_PLUGINS"


def allowed_names(allow) -> set[str] | None:
    """The entry-point names allowed to load; None means all of them.

    ``allow`` (an iterable of names, or a comma-separated string) wins over the
    ``LORAGATE_PLUGINS`` environment variable; a set but empty variable allows none.
    """
    if allow is None:
        allow = os.environ.get(ALLOW_ENV)
        if allow is None:
            return None
    if isinstance(allow, str):
        allow = allow.split(",")
    names = {str(name).strip() for name in allow}
    return {name for name in names if name}


def discover_entry_points(allow) -> list[importlib.metadata.EntryPoint]:
    """The group's entry points that the allow-list lets through, one per name.

    Raises PluginLoadError for an allowed name no installed package provides (a typo
    would otherwise silently run without the plugin), or a name two packages claim.
    """
    allowed = allowed_names(allow)
    by_name: dict[str, importlib.metadata.EntryPoint] = {}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and entry_point.name not in allowed:
            continue
        known = by_name.get(entry_point.name)
        if known is not None and known.value != entry_point.value:
            raise PluginLoadError(
                entry_point.name,
                f"plugin {entry_point.name!r} is provided twice, by {known.value!r} and "
                f"{entry_point.value!r}: uninstall one",
            )
        by_name[entry_point.name] = entry_point
    missing = sorted((allowed or set()) - set(by_name))
    if missing:
        installed = sorted(
            ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
        )
        raise PluginLoadError(
            missing[0],
            f"{ALLOW_ENV} allows plugin(s) {missing}, which no installed package provides "
            f"(installed {ENTRY_POINT_GROUP!r} entry points: {installed})",
        )
    return [by_name[name] for name in sorted(by_name)]


def load_entry_point(entry_point: importlib.metadata.EntryPoint):
    try:
        return _instantiate(entry_point.load())
    except Exception as exc:
        raise _import_error(entry_point.name, entry_point.value, exc) from exc


def load_reference(reference: str):
    """The object a "module:object" (or "module") string names; a class is instantiated."""
    if not isinstance(reference, str) or not reference.strip():
        raise PluginLoadError(
            str(reference), f"plugin reference must be 'module:object', got {reference!r}"
        )
    module_name, _, attribute = reference.strip().partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in attribute.split(".") if attribute else ():
            target = getattr(target, part)
        return _instantiate(target)
    except Exception as exc:
        raise _import_error(reference, reference, exc) from exc


def _instantiate(target):
    return target() if inspect.isclass(target) else target


def _import_error(name: str, value: str, exc: Exception) -> PluginLoadError:
    return PluginLoadError(
        name, f"plugin {name!r} ({value}) failed to import: {type(exc).__name__}: {exc}"
    )

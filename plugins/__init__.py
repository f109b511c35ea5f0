"""loragate.plugins: pluggy hookspecs, the plugin manager, and the built-in plugins.

A plugin is any object (module, class instance) with ``@hookimpl``-marked ``loragate_*``
functions; see docs/plugins.md.
"""

from loragate.plugins.decoding import DecodingStrategy, Hypothesis, StepDecision
from loragate.plugins.errors import InvalidParam, PluginError, PluginLoadError
from loragate.plugins.manager import NamedHook, PluginManager
from loragate.plugins.markers import hookimpl, hookspec

__all__ = [
    "DecodingStrategy",
    "Hypothesis",
    "StepDecision",
    "InvalidParam",
    "NamedHook",
    "PluginError",
    "PluginLoadError",
    "PluginManager",
    "hookimpl",
    "hookspec",
]

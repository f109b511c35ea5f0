"""Errors that name the plugin at fault, so an operator knows which package to blame."""

from __future__ import annotations


class PluginLoadError(ValueError):
    """A plugin could not be imported or registered: start-up stops."""

    def __init__(self, plugin_name: str, message: str) -> None:
        super().__init__(message)
        self.plugin_name = plugin_name


class PluginError(RuntimeError):
    """A loaded plugin's hook raised or returned something unusable."""

    def __init__(self, plugin_name: str, message: str) -> None:
        super().__init__(message)
        self.plugin_name = plugin_name

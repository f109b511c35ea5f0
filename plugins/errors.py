"""Errors that name the plugin at fault, so an operator knows which package to blame, and
the refusal of a request's value that names the field at fault, so a client knows which
field to fix."""

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


class InvalidParam(ValueError):
    """A request value refused where it is checked (the engine's checks, a plugin's hook):
    ``field`` is its name in SamplingParams or the prompt (``top_p``, ``prompt``,
    ``structured_outputs``), ``str(exc)`` says why.

    A ValueError, so callers that catch ValueError still do. The gateway renames the field
    to the one of the request the client sent (``parameters.top_p`` for TGI,
    ``max_completion_tokens`` for a chat that used it), never reading it from the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self):
        """Pickled whole across processes (a replica's refusal reaches the ingress)."""
        return (type(self), (self.field, str(self)))

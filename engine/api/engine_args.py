"""vLLM's `EngineArgs` / `AsyncEngineArgs`: the engine's settings as a plain dataclass.

vLLM code builds these, then `LLMEngine.from_engine_args(args)` or
`AsyncLLMEngine.from_engine_args(args)`. Their fields are EngineConfig's, generated from it,
so the two can never drift apart; each value is checked when the args are built and again
when `create_engine_config()` turns them into the frozen EngineConfig.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, field, fields, make_dataclass

from loragate.engine.api.config import EngineConfig


def _same_default(source: Field) -> Field:
    if source.default_factory is not MISSING:
        return field(default_factory=source.default_factory)
    return field(default=source.default)


def _post_init(self) -> None:
    self.create_engine_config()  # a bad value fails here, naming the field


def create_engine_config(self) -> EngineConfig:
    """The frozen, validated EngineConfig these args describe."""
    values = {f.name: getattr(self, f.name) for f in fields(EngineConfig)}
    values["plugins"] = tuple(values["plugins"])  # a list of plugins, as LLM(plugins=[...])
    return EngineConfig(**values)


EngineArgs = make_dataclass(
    "EngineArgs",
    [(f.name, f.type, _same_default(f)) for f in fields(EngineConfig)],
    namespace={
        "__doc__": "The engine's settings (EngineConfig's fields), as vLLM's EngineArgs.",
        "__post_init__": _post_init,
        "create_engine_config": create_engine_config,
    },
)
EngineArgs.__module__ = __name__


class AsyncEngineArgs(EngineArgs):
    """The same settings for `AsyncLLMEngine.from_engine_args`, as vLLM's AsyncEngineArgs."""


def engine_config_from(engine_args) -> EngineConfig:
    """EngineArgs (or AsyncEngineArgs) to EngineConfig; anything else is a TypeError."""
    if not isinstance(engine_args, EngineArgs):
        raise TypeError(
            "from_engine_args needs EngineArgs or AsyncEngineArgs, "
            f"got {type(engine_args).__name__}"
        )
    return engine_args.create_engine_config()

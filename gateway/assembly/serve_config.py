"""`loragate serve --config FILE`: a YAML file of settings, as vLLM's `--config`.

Its keys are `serve`'s long option names, with dashes or underscores (`max-num-seqs`,
`max_num_seqs`; `plugin` or `plugins`); its values what the flags take (a list for a
repeatable flag; `lora-modules` may also be a mapping of name to directory). The file's
values become the command's defaults (click's `default_map`), so a flag on the command line
overrides them; an environment variable a flag reads (LORAGATE_API_KEY, ...) does too. Each
value is converted and checked as its flag's would be, and an unknown key or a bad value is a
usage error naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

NOT_SETTINGS = {"config", "help"}


def config_option(command):
    """Add `--config FILE` to `command`, read before its other options."""
    return click.option(
        "--config",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        is_eager=True,
        expose_value=False,
        callback=_read_config,
        help="YAML file of settings, keyed by these options' long names (dashes or "
        "underscores); flags given on the command line override it.",
    )(command)


def _read_config(ctx: click.Context, param: click.Parameter, path: Path | None) -> None:
    if path is None:
        return
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise click.BadParameter(f"{path} is not YAML: {exc}", ctx, param) from exc
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise click.BadParameter(f"{path} is not a mapping of option names", ctx, param)
    options = _options_by_key(ctx.command)
    defaults = dict(ctx.default_map or {})
    for key, value in loaded.items():
        option = options.get(str(key).replace("-", "_"))
        if option is None:
            raise click.BadParameter(f"unknown key {key!r} in {path}", ctx, param)
        value = _as_flag_value(option, value)
        defaults[option.name] = _checked(ctx, param, option, f"key {key!r} in {path}", value)
    ctx.default_map = defaults


def _options_by_key(command: click.Command) -> dict[str, click.Option]:
    """Each option under its parameter name and its long flags' names, with underscores."""
    keys: dict[str, click.Option] = {}
    for option in command.params:
        if not isinstance(option, click.Option) or option.name in NOT_SETTINGS:
            continue
        keys[option.name] = option
        for flag in option.opts:
            if flag.startswith("--"):
                keys[flag[2:].replace("-", "_")] = option
    return keys


def _as_flag_value(option: click.Option, value: Any) -> Any:
    if not option.multiple:
        # A mapping for a JSON flag (--speculative-config) is that JSON.
        return json.dumps(value) if isinstance(value, dict) else value
    if isinstance(value, dict):  # lora-modules: {name: dir}
        return [f"{name}={path}" for name, path in value.items()]
    values = value if isinstance(value, list) else [value]
    return [json.dumps(v) if isinstance(v, dict) else v for v in values]


def _checked(
    ctx: click.Context, param: click.Parameter, option: click.Option, where: str, value: Any
) -> Any:
    """The value converted as the option's flag converts it, or an error saying `where`."""
    if value is None:
        return None
    try:
        return option.type_cast_value(ctx, value)
    except click.BadParameter as exc:
        raise click.BadParameter(f"{where}: {exc.message}", ctx, param) from exc
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(f"{where}: {value!r} is not a valid value", ctx, param) from exc

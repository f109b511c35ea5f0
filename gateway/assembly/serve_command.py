"""`loragate serve`: its options, the settings they make, and the server's start. Loaded by
the `loragate` command group (cli.py) only when `serve` runs or its help is shown."""

from __future__ import annotations

import logging
import sys

import click
from click.core import ParameterSource

from loragate.engine import EngineConfig
from loragate.gateway.assembly.serve_config import config_option
from loragate.gateway.assembly.serve_options import GroupedCommand, serve_options, split_options
from loragate.gateway.settings import GatewaySettings


@click.command(cls=GroupedCommand)
@click.argument("model_tag", required=False, metavar="[MODEL]")
@config_option
@serve_options
@click.option(
    "--log-level",
    default="info",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level.",
)
def serve(model_tag, **options) -> None:
    """Serve the OpenAI-, vLLM- and TGI/LoRAX-compatible HTTP API.

    MODEL (as `vllm serve MODEL`) is the base model, like --model. Settings may also come
    from a YAML file (--config), which the flags override. `--help=WORD` shows only the
    option groups whose title has WORD in it (e.g. --help=lora), as `vllm serve --help=<group>`."""
    if model_tag is not None:
        from_file = (
            click.get_current_context().get_parameter_source("model") is ParameterSource.DEFAULT_MAP
        )
        if options["model"] not in (None, model_tag) and not from_file:
            raise click.UsageError(f"MODEL {model_tag!r} and --model {options['model']!r} differ")
        options["model"] = model_tag
    setup_logging(options.pop("log_level"))
    from loragate.gateway.assembly.server import serve as run_server

    settings = _settings(options)
    if settings.require_durable_registry:
        _refuse_a_volatile_registry(settings)
    if not run_server(settings, announce=click.echo):
        sys.exit(1)


def _refuse_a_volatile_registry(settings: GatewaySettings) -> None:
    """--require-durable-registry, checked before the model loads: exit 1 with the reason."""
    import asyncio

    from loragate.gateway.registry_care.care import check_before_start, refusal

    persistence = asyncio.run(check_before_start(settings))
    if not persistence.durable:
        logging.getLogger("loragate.registry_care").error("%s", refusal(persistence))
        click.echo(refusal(persistence), err=True)
        sys.exit(1)


def _settings(options: dict) -> GatewaySettings:
    engine, gateway = split_options(options)
    engine["plugins"] = plugin_specs(engine["plugins"])
    try:
        return GatewaySettings(engine=EngineConfig(**engine), **gateway)
    except (ValueError, FileNotFoundError) as exc:
        raise click.UsageError(str(exc)) from exc


def plugin_specs(specs) -> tuple[str, ...]:
    for spec in specs:
        if ":" not in spec:
            raise click.BadParameter(f"{spec!r} is not MODULE:OBJECT", param_hint="--plugin")
    return tuple(specs)


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

"""The `loragate` command: `serve`, `plugins` (what is loaded), adapter helpers
(`adapters make-random`, `train-demo`), and registry backups (`registry export|import`)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import click

from loragate.gateway.registry_care.commands import registry

# Commands imported when they run (or their help is shown): `serve` brings the engine, torch
# and the HTTP stack, which `loragate registry ...` never needs (seconds of start saved).
LAZY_COMMANDS = {"serve": "loragate.gateway.assembly.serve_command:serve"}


class _LazyCommands(dict):
    """A group's commands by name; one of LAZY_COMMANDS is imported when first asked for."""

    def __missing__(self, name: str) -> click.Command:
        if name not in LAZY_COMMANDS:
            raise KeyError(name)
        module, attribute = LAZY_COMMANDS[name].split(":")
        command = self[name] = getattr(importlib.import_module(module), attribute)
        return command


class _Commands(click.Group):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(self.commands)

    def parse_args(self, ctx, args):
        if "serve" in args:
            from loragate.gateway.assembly.serve_options import spread_many_valued

            args = spread_many_valued(list(args))
        return super().parse_args(ctx, args)

    def list_commands(self, ctx) -> list[str]:
        return sorted({*self.commands, *LAZY_COMMANDS})

    def get_command(self, ctx, name: str) -> click.Command | None:
        try:
            return self.commands[name]
        except KeyError:
            return None


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(package_name="loragate", message="loragate %(version)s")
def main() -> None:
    """loragate: one base model, many LoRA adapters, one continuously batched engine."""


main.add_command(registry)


@main.command()
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE:OBJECT",
    help="Also load this plugin, as `serve --plugin` would (repeatable).",
)
@click.option(
    "--entry-points/--no-entry-points",
    default=True,
    help="Load plugins from the `loragate.plugins` entry points (LORAGATE_PLUGINS limits them).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def plugins(plugins, entry_points, as_json) -> None:
    """List the plugins `serve` would load, where each comes from, and the hooks it implements."""
    from loragate.gateway.assembly.serve_command import plugin_specs
    from loragate.plugins import PluginManager

    try:
        manager = PluginManager.create(plugin_specs(plugins), load_entrypoints=entry_points)
    except ValueError as exc:  # PluginLoadError included
        raise click.UsageError(str(exc)) from exc
    described = manager.describe()
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    for plugin in described:
        click.echo(f"{plugin['name']}  ({plugin['source']})")
        click.echo(f"    hooks: {', '.join(plugin['hooks']) or '-'}")


def _out_option(help_text: str):
    return click.option(
        "--out", required=True, type=click.Path(file_okay=False, path_type=Path), help=help_text
    )


_model_option = click.option(
    "--model", default=None, help="Base model (HF directory or .gguf). Default: the default model."
)


@main.group()
def adapters() -> None:
    """Make adapters for the served model."""


@adapters.command("make-random")
@click.argument("name")
@click.option("--rank", default=8, type=int, help="LoRA rank.")
@click.option(
    "--targets",
    default="q_proj,v_proj",
    help="Comma-separated modules to adapt (q_proj,k_proj,v_proj,o_proj,gate_proj,...).",
)
@click.option("--alpha", default=None, type=float, help="LoRA alpha. Default: the rank.")
@click.option("--seed", default=0, type=int, help="Seed of the random weights.")
@_out_option("Directory the adapter folder NAME is written in.")
@_model_option
def make_random(name, rank, targets, alpha, seed, out, model) -> None:
    """Write a random (but real, PEFT-format) adapter NAME for the base model."""
    from loragate.tools import make_random_adapter

    source = _source(model)
    base = _load_hf_model(source.hf_dir)
    target_list = [t.strip() for t in targets.split(",") if t.strip()]
    try:
        path = make_random_adapter(
            base,
            out / name,
            rank=rank,
            targets=target_list,
            alpha=alpha,
            seed=seed,
            base_model_name=source.name,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"wrote adapter {name} to {path}")


@adapters.command("train-demo")
@_out_option("Directory the demo adapters are written in, one folder each.")
@_model_option
@click.option("--steps", default=30, type=int, help="Training steps per adapter.")
@click.option("--seed", default=0, type=int, help="Seed of the training data and initial weights.")
def train_demo(out, model, steps, seed) -> None:
    """Train the demo adapters ("uppercase", "terse") on the base model (minutes on CPU)."""
    from transformers import AutoTokenizer

    from loragate.tools.training import train_demo_adapters

    source = _source(model)
    base = _load_hf_model(source.hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(source.hf_dir)
    try:
        written = train_demo_adapters(
            base,
            tokenizer,
            out,
            steps=steps,
            seed=seed,
            base_model_name=source.name,
            report=lambda line: click.echo(line, err=True),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    for name, path in written.items():
        click.echo(f"wrote adapter {name} to {path}")


def _source(model: str | None):
    from loragate.tools.base_model import resolve_base_model

    try:
        return resolve_base_model(model)
    except (ValueError, FileNotFoundError) as exc:
        raise click.UsageError(str(exc)) from exc


def _load_hf_model(hf_dir: Path):
    from loragate.tools.base_model import load_hf_model

    return load_hf_model(hf_dir)


if __name__ == "__main__":
    main()

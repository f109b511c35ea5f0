"""`loragate serve --help` in option groups, and `--config FILE` (YAML): the file sets engine
and gateway settings, flags override it, an unknown key or a bad value is refused by name."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from loragate.gateway.assembly.cli import main
from loragate.gateway.assembly.serve_options import SERVE_GROUPS


@pytest.fixture
def served_settings(monkeypatch):
    """`serve` builds its settings, then hands them here instead of starting a server."""
    from loragate.gateway.assembly import server

    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, announce: seen.append(settings) or True)
    return seen


def _sections(help_text: str) -> dict[str, list[str]]:
    """Each `Title:` section of the help and the long flags listed in it, in order."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in help_text.splitlines():
        if re.fullmatch(r"[A-Z][A-Za-z /]+:", line):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  --"):
            current.append(line.split()[0])
    return sections


def test_help_lists_the_groups_with_their_options():
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    sections = _sections(help_text)
    titles = [title for title, _ in SERVE_GROUPS]
    assert list(sections) == titles  # every group, in order, and no "Other options"
    assert sections["Model and loading"][:3] == ["--model", "--served-model-name", "--tokenizer"]
    assert sections["Engine and KV cache"][:2] == ["--block-size", "--gpu-memory-utilization"]
    assert sections["LoRA and adapters"][:5] == [
        "--enable-lora",
        "--max-loras",
        "--max-lora-rank",
        "--max-cpu-loras",
        "--lora-modules",
    ]
    assert sections["Scheduling"][:2] == ["--max-num-seqs", "--max-num-batched-tokens"]
    assert sections["Serving and HTTP"][:3] == ["--host", "--port", "--api-key"]
    assert "--admin-key" in sections["Tenancy and registry"]
    assert "--replicas" in sections["Replicas"]
    assert "--log-level" in sections["Observability"]
    assert "--max-connections" in sections["Advanced tuning"]
    assert "--config" in sections["General"]


def test_every_serve_option_is_in_exactly_one_group():
    names = [name for _, group in SERVE_GROUPS for name in group]
    assert len(names) == len(set(names))
    params = {p.name for p in main.commands["serve"].params if p.name != "model_tag"}
    assert set(names) == params | {"help"}


def test_help_says_which_flag_sizes_the_kv_cache_and_caps_adapter_memory():
    params = {p.name: p for p in main.commands["serve"].params}
    assert "the one flag to size the KV cache" in params["kv_cache_memory_gb"].help
    assert "--kv-cache-memory-gb" in params["num_kv_blocks"].help
    assert "--kv-cache-memory-gb" in params["gpu_memory_utilization"].help
    assert "the flag to cap adapter memory" in params["max_cpu_lora_bytes"].help
    assert "the flag to cap the device tier's adapter memory" in params["max_lora_bytes"].help


def _write(tmp_path, text: str):
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return str(path)


def test_a_yaml_config_sets_engine_and_gateway_settings(tiny_dir, tmp_path, served_settings):
    config = _write(
        tmp_path,
        f"""
model: {tiny_dir}
served-model-name: [tiny-a, tiny-b]
max_num_seqs: 7
max-model-len: 512
enable-prefix-caching: false
preemption-mode: swap
swap_space: 0.5
enable-lora: true
plugin: [gateway_test_plugin:RunnerUpPlugin]
port: 8123
max-queue: 11
lora-modules:
  first: {tmp_path}
""",
    )
    result = CliRunner().invoke(main, ["serve", "--config", config])
    assert result.exit_code == 0, result.output
    settings = served_settings[-1]
    engine = settings.engine
    assert engine.model == str(tiny_dir) and engine.served_model_name == "tiny-a"
    assert (engine.max_num_seqs, engine.max_model_len) == (7, 512)
    assert (engine.enable_prefix_caching, engine.preemption_mode, engine.swap_space) == (
        False,
        "swap",
        0.5,
    )
    assert engine.plugins == ("gateway_test_plugin:RunnerUpPlugin",)
    assert (settings.port, settings.max_queue) == (8123, 11)
    assert settings.model_aliases == ("tiny-b",)
    assert settings.lora_modules == (f"first={tmp_path}",)


def test_flags_override_the_file(tiny_dir, tmp_path, served_settings):
    config = _write(
        tmp_path, "model: /no/such/model\nmax-num-seqs: 7\nport: 8123\nenable_prefix_caching: no\n"
    )
    result = CliRunner().invoke(
        main,
        [
            "serve",
            str(tiny_dir),
            "--config",
            config,
            "--max-num-seqs",
            "3",
            "--enable-prefix-caching",
        ],
    )
    assert result.exit_code == 0, result.output
    settings = served_settings[-1]
    assert settings.engine.model == str(tiny_dir)  # MODEL on the command line wins
    assert settings.engine.max_num_seqs == 3 and settings.engine.enable_prefix_caching is True
    assert settings.port == 8123  # not given as a flag: the file's


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("max-num-seq: 4\n", "unknown key 'max-num-seq'"),
        ("config: other.yaml\n", "unknown key 'config'"),
        ("max_num_seqs: many\n", "key 'max_num_seqs'"),
        ("preemption-mode: sometimes\n", "key 'preemption-mode'"),
        ("enable-lora: maybe\n", "key 'enable-lora'"),
        ("max-num-seqs: 0\n", "max_num_seqs"),  # the config's own check, as for the flag
        ("port: 70000\n", "port"),
        ("- just\n- a list\n", "not a mapping"),
        ("max-num-seqs: [\n", "not YAML"),
    ],
)
def test_unknown_keys_and_bad_values_are_refused_by_name(
    text, named, tiny_dir, tmp_path, served_settings
):
    config = _write(tmp_path, text)
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_dir), "--config", config])
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert served_settings == []


def test_a_missing_config_file_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and "--config" in result.output


def test_lora_modules_as_a_list_of_strings_and_objects(tiny_dir, tmp_path, served_settings):
    config = _write(
        tmp_path,
        f"""
lora-modules:
  - first={tmp_path}
  - {{name: second, path: {tmp_path}}}
""",
    )
    result = CliRunner().invoke(main, ["serve", str(tiny_dir), "--config", config])
    assert result.exit_code == 0, result.output
    assert served_settings[-1].lora_modules == (
        f"first={tmp_path}",
        json.dumps({"name": "second", "path": str(tmp_path)}),
    )


def test_help_of_one_group():
    lora = CliRunner().invoke(main, ["serve", "--help=lora"], terminal_width=200)
    assert lora.exit_code == 0, lora.output
    assert list(_sections(lora.output)) == ["LoRA and adapters"]
    assert "--max-lora-rank" in lora.output and "--max-num-seqs" not in lora.output
    kv = CliRunner().invoke(main, ["serve", "--help=engine-and-kv-cache"], terminal_width=200)
    assert list(_sections(kv.output)) == ["Engine and KV cache"]
    everything = CliRunner().invoke(main, ["serve", "--help=all"], terminal_width=200)
    assert list(_sections(everything.output)) == [title for title, _ in SERVE_GROUPS]
    unknown = CliRunner().invoke(main, ["serve", "--help=nothing"])
    assert unknown.exit_code == 2 and "no such group" in unknown.output
    assert "lora-and-adapters" in unknown.output

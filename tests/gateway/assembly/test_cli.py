"""The `loragate` command: flags and help, bad settings, make-random, and a real `serve`
process that prints where it listens, logs each request, and drains on SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading

import httpx
import openai
import pytest
from click.testing import CliRunner
from servers_testlib import ServeProcess
from services_testlib import flush_namespace

from loragate.engine import EngineConfig
from loragate.gateway.assembly.cli import main
from loragate.gateway.settings import GatewaySettings

SERVE_FLAGS = [
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--adapter-root",
    "--max-model-len",
    "--max-num-seqs",
    "--max-loras",
    "--max-lora-rank",
    "--max-cpu-loras",
    "--max-queue",
    "--plugin",
    "--max-num-batched-tokens",
    "--block-size",
    "--kv-cache-memory-gb",
    "--num-kv-blocks",
    "--dtype",
    "--device",
    "--seed",
    "--shutdown-timeout",
    "--max-body-bytes",
    "--redis-url",
    "--redis-namespace",
    "--admin-key",
    "--registry-resync-seconds",
    "--auth-cache-seconds",
    "--quota-lease-seconds",
    "--swap-space",
    "--preemption-mode",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--max-step-ms",
    "--scheduling-policy",
]


def test_help_documents_every_flag():
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in SERVE_FLAGS:
        assert flag in result.output, flag
    top = CliRunner().invoke(main, ["--help"])
    assert "serve" in top.output and "adapters" in top.output and "plugins" in top.output
    sub = CliRunner().invoke(main, ["adapters", "--help"])
    assert "make-random" in sub.output and "train-demo" in sub.output


def test_every_config_field_has_a_documented_flag():
    """`serve`'s flags are made from EngineConfig's and GatewaySettings' fields: each field
    has its flag, with help text, in `serve --help`."""
    params = {p.name: p for p in main.commands["serve"].params}
    fields = [f.name for f in dataclasses.fields(EngineConfig)]
    fields += [f.name for f in dataclasses.fields(GatewaySettings) if f.name != "engine"]
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    for name in fields:
        assert name in params, f"no flag for {name}"
        assert params[name].help, f"--{name} has no help"
        assert params[name].opts[0] in help_text, name


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (["--max-step-ms", "0"], "max_step_ms"),
        (["--max-queue", "-1"], "max_queue"),
        (["--port", "70000"], "port"),
        (["--max-loras", "9", "--max-cpu-loras", "2"], "max_cpu_loras"),
        (["--plugin", "nocolon"], "MODULE:OBJECT"),
        (["--admin-key", "short"], "admin_key"),
        (["--redis-url", "http://127.0.0.1:6379"], "redis_url"),
        (["--redis-namespace", "bad space"], "redis_namespace"),
        (["--registry-resync-seconds", "0"], "registry_resync_seconds"),
        (["--swap-space", "-1"], "swap_space"),
        (["--preemption-mode", "swap", "--swap-space", "0"], "swap_space"),
        (["--preemption-mode", "sometimes"], "'sometimes' is not one of 'auto', 'recompute'"),
        (["--no-enable-prefix-caching=1"], "--no-enable-prefix-caching"),
    ],
)
def test_bad_settings_exit_with_the_field_named(args, named, tiny_dir):
    result = CliRunner().invoke(main, ["serve", "--model", str(tiny_dir), *args])
    assert result.exit_code == 2
    assert named in result.output


@pytest.fixture
def served_settings(monkeypatch):
    """`serve` builds its settings, then hands them here instead of starting a server."""
    from loragate.gateway.assembly import server

    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, announce: seen.append(settings) or True)
    return seen


def test_kv_memory_flags_reach_the_engine_config(tiny_dir, served_settings):
    defaults = CliRunner().invoke(main, ["serve", "--model", str(tiny_dir)])
    assert defaults.exit_code == 0, defaults.output
    chosen = CliRunner().invoke(
        main,
        [
            "serve",
            "--model",
            str(tiny_dir),
            "--no-enable-prefix-caching",
            "--preemption-mode",
            "swap",
            "--swap-space",
            "0.5",
        ],
    )
    assert chosen.exit_code == 0, chosen.output
    default, engine = served_settings[0].engine, served_settings[1].engine
    assert (default.enable_prefix_caching, default.preemption_mode, default.swap_space) == (
        EngineConfig.enable_prefix_caching,
        EngineConfig.preemption_mode,
        EngineConfig.swap_space,
    )
    assert (engine.enable_prefix_caching, engine.preemption_mode, engine.swap_space) == (
        False,
        "swap",
        0.5,
    )
    again = CliRunner().invoke(
        main,
        [
            "serve",
            "--model",
            str(tiny_dir),
            "--enable-prefix-caching",
            "--preemption-mode",
            "recompute",
        ],
    )
    assert again.exit_code == 0, again.output
    assert served_settings[2].engine.enable_prefix_caching is True
    assert served_settings[2].engine.preemption_mode == "recompute"


def test_missing_adapter_root_is_refused(tiny_dir, tmp_path):
    result = CliRunner().invoke(
        main, ["serve", "--model", str(tiny_dir), "--adapter-root", str(tmp_path / "missing")]
    )
    assert result.exit_code == 2 and "adapter_root" in result.output


def test_make_random_writes_an_adapter_the_server_accepts(tiny_dir, adapter_root, url):
    result = CliRunner().invoke(
        main,
        [
            "adapters",
            "make-random",
            "cli-made",
            "--rank",
            "4",
            "--targets",
            "q_proj,v_proj",
            "--out",
            str(adapter_root),
            "--model",
            str(tiny_dir),
            "--seed",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert (adapter_root / "cli-made" / "adapter_model.safetensors").is_file()
    got = httpx.post(
        f"{url}/v1/adapters", json={"name": "cli-made", "path": "cli-made"}, timeout=60
    )
    assert got.status_code == 201 and got.json()["rank"] == 4
    assert sorted(got.json()["target_modules"]) == ["q_proj", "v_proj"]
    assert httpx.delete(f"{url}/v1/adapters/cli-made", timeout=60).status_code == 200


def stream_body(model, max_tokens):
    return {
        "model": model,
        "prompt": "Go on",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def test_serve_process_logs_requests_and_drains_on_sigterm(tiny_dir):
    server = ServeProcess(
        "--model",
        str(tiny_dir),
        "--served-model-name",
        "tiny-cli",
        "--max-model-len",
        "1024",
        "--num-kv-blocks",
        "128",
    )
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{server.url}/health").json()["model"] == "tiny-cli"
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST", f"{server.url}/v1/completions", json=stream_body("tiny-cli", 600)
            ) as response,
        ):
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"
        finishes = [json.loads(x[5:])["choices"][0]["finish_reason"] for x in rest[:-1]]
        assert finishes[-1] == "length"  # the running request finished: drained, not cut
        assert len(finishes) >= 500
        assert server.proc.wait(120) in (0, -signal.SIGTERM)
        log = "".join(server.stderr)
        assert '"GET /health" 200' in log
        assert '"POST /v1/completions" 200' in log
    finally:
        server.stop()


def test_shutdown_timeout_bounds_the_drain(tiny_dir):
    server = ServeProcess(
        "--model",
        str(tiny_dir),
        "--max-model-len",
        "2048",
        "--num-kv-blocks",
        "256",
        "--shutdown-timeout",
        "0.5",
    )
    try:
        model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        with (
            httpx.Client(timeout=120) as client,
            client.stream(
                "POST", f"{server.url}/v1/completions", json=stream_body(model, 2000)
            ) as response,
        ):
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            server.proc.send_signal(signal.SIGTERM)
            with pytest.raises(httpx.HTTPError):  # cut off once the drain time is up
                for _ in lines:
                    pass
        assert server.proc.wait(120) in (0, -signal.SIGTERM)
        assert "timeout graceful shutdown exceeded" in "".join(server.stderr)
    finally:
        server.stop()


def test_train_demo_writes_adapters_the_server_accepts(tiny_dir, adapter_root, url):
    out = adapter_root / "demo"
    result = CliRunner().invoke(
        main,
        ["adapters", "train-demo", "--out", str(out), "--model", str(tiny_dir), "--steps", "2"],
    )
    assert result.exit_code == 0, result.output
    # a line per stage, and per step (two steps: each is a tenth or more), on stderr
    progress = [line for line in result.stderr.splitlines() if line.strip()]
    assert [line.split(" (")[0] for line in progress if line.startswith("[")] == [
        "[1/3] answering 48 questions with the base model",
        "[2/3] training uppercase",
        "[3/3] training terse",
    ]
    steps = [line.split(",")[0].strip() for line in progress if "step " in line]
    assert steps == [f"{name}: step {i}/2" for name in ("uppercase", "terse") for i in (1, 2)]
    assert progress[-1].startswith("trained the demo adapters in ")
    assert all("about" in line and "s left" in line for line in progress if "step " in line)
    for name in ("uppercase", "terse"):
        assert f"wrote adapter {name}" in result.output
        got = httpx.post(
            f"{url}/v1/adapters", json={"name": f"demo-{name}", "path": f"demo/{name}"}, timeout=60
        )
        assert got.status_code == 201, got.text
        assert httpx.delete(f"{url}/v1/adapters/demo-{name}", timeout=60).status_code == 200


RUNNER_UP = "gateway_test_plugin:RunnerUpPlugin"


def test_plugins_lists_what_serve_would_load():
    result = CliRunner().invoke(main, ["plugins", "--plugin", RUNNER_UP])
    assert result.exit_code == 0, result.output
    assert "builtin.samplers  (builtin)" in result.output
    assert "gateway_test_plugin:RunnerUpPlugin  (--plugin gateway_test_plugin:RunnerUpPlugin)" in (
        result.output
    )
    described = json.loads(
        CliRunner().invoke(main, ["plugins", "--json", "--plugin", RUNNER_UP]).output
    )
    mine = [p for p in described if p["name"] == "gateway_test_plugin:RunnerUpPlugin"]
    assert mine == [
        {
            "name": "gateway_test_plugin:RunnerUpPlugin",
            "source": "--plugin gateway_test_plugin:RunnerUpPlugin",
            "hooks": ["loragate_samplers"],
        }
    ]
    assert {"builtin.samplers", "builtin.beam_search"} <= {p["name"] for p in described}
    for bad, says in (("no_such_module:X", "No module named"), ("nocolon", "MODULE:OBJECT")):
        failed = CliRunner().invoke(main, ["plugins", "--plugin", bad])
        assert failed.exit_code == 2 and says in failed.output


def test_serve_process_with_redis_and_admin_key_from_the_environment(tiny_dir, redis_url):
    namespace = f"test-cli-{os.getpid()}-{threading.get_ident()}"
    admin = "cli-admin-key-" + "z" * 16
    server = ServeProcess(
        "--model",
        str(tiny_dir),
        "--redis-url",
        redis_url,
        "--redis-namespace",
        namespace,
        "--max-model-len",
        "1024",
        "--num-kv-blocks",
        "128",
        env={"LORAGATE_ADMIN_KEY": admin},
    )
    try:
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        headers = {"Authorization": f"Bearer {admin}"}
        created = httpx.post(f"{server.url}/v1/tenants", json={"name": "cli"}, headers=headers)
        assert created.status_code == 201
        tenant = {"Authorization": f"Bearer {created.json()['api_key']}"}
        assert httpx.get(f"{server.url}/v1/models", headers=tenant).status_code == 200
        health = httpx.get(f"{server.url}/health").json()  # anyone: no address
        assert health["status"] == "ok" and health["registry"] == {"reachable": True}
        assert "redis" not in json.dumps(health)
        health = httpx.get(f"{server.url}/health", headers=headers).json()
        assert health["registry"]["backend"] == redis_url  # the operator
    finally:
        server.stop()
        flush_namespace(namespace, redis_url)
    log = "".join(server.stderr)
    assert admin not in log and created.json()["api_key"] not in log


def test_vllm_style_serve_with_lora_modules_api_key_and_several_names(tiny_dir, adapter_root):
    """`loragate serve MODEL --lora-modules a=DIR {json} --api-key K --served-model-name x y`
    as vLLM takes it: the adapters answer by name, every API call needs the key."""
    key = "shared-vllm-key"
    module = json.dumps({"name": "second", "path": str(adapter_root / "beta")})
    server = ServeProcess(
        str(tiny_dir),
        "--lora-modules",
        f"first={adapter_root / 'alpha'}",
        module,
        "--api-key",
        key,
        "--served-model-name",
        "tiny-x",
        "tiny-y",
        "--max-model-len",
        "512",
        "--num-kv-blocks",
        "128",
    )
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)
        names = {m.id for m in client.models.list().data}
        assert {"tiny-x", "first", "second"} <= names
        outs = {
            model: client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=8, temperature=0
            )
            .choices[0]
            .text
            for model in ("first", "second", "tiny-x", "tiny-y")
        }
        assert outs["tiny-x"] == outs["tiny-y"]  # one base model, two names
        assert outs["first"] != outs["tiny-x"] and outs["second"] != outs["first"]
        keyless = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            keyless.completions.create(model="first", prompt="x", max_tokens=2)
        assert httpx.get(f"{server.url}/v1/models").status_code == 401
        tgi = httpx.post(f"{server.url}/generate", json={"inputs": "x"})
        assert tgi.status_code == 401  # in TGI's shape, which the lorax client parses
        assert tgi.json()["error_type"] == "authentication" and "API key" in tgi.json()["error"]
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        server.stop()
    assert key not in "".join(server.stderr)


def test_bad_lora_modules_and_api_key_with_admin_key_are_refused(tiny_dir):
    for args, named in (
        (["--lora-modules", "nodir"], "lora_modules"),
        (["--lora-modules", '{"name": "x"}'], "lora_modules"),
        (["--api-key", "k", "--admin-key", "a" * 32], "api_key"),
    ):
        result = CliRunner().invoke(main, ["serve", "--model", str(tiny_dir), *args])
        assert result.exit_code != 0 and named in result.output, (args, result.output)


def test_vllm_tool_flags_reach_the_settings(tiny_dir, served_settings, tmp_path):
    template = tmp_path / "tools.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{{ tools }}")
    result = CliRunner().invoke(
        main,
        [
            "serve",
            str(tiny_dir),
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "llama3_json",
            "--chat-template",
            str(template),
        ],
    )
    assert result.exit_code == 0, result.output
    settings = served_settings[-1]
    assert settings.enable_auto_tool_choice and settings.tool_call_parser == "llama3_json"
    assert settings.chat_template == str(template)


def test_bad_tool_flags_are_refused_naming_the_flag(tiny_dir, tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    for args, named in (
        (["--enable-auto-tool-choice"], "tool_call_parser"),
        (["--tool-call-parser", "mistral"], "'mistral' is not one of"),
        (["--chat-template", str(tmp_path / "missing.jinja")], "chat_template"),
        (["--chat-template", str(broken)], "chat_template does not parse"),
    ):
        result = CliRunner().invoke(main, ["serve", "--model", str(tiny_dir), *args])
        assert result.exit_code != 0 and named in result.output, (args, result.output)

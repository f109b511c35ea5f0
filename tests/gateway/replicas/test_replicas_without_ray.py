"""Without the `ray` extra installed: `serve --replicas` exits at once saying how to install
it, and the single-process server does not need it. A fake `ray` package whose import fails
stands in for a machine without Ray (this venv has it)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loragate.gateway.settings import GatewaySettings


@pytest.fixture
def no_ray_env(tmp_path):
    blocker = tmp_path / "no-ray"
    (blocker / "ray").mkdir(parents=True)
    (blocker / "ray" / "__init__.py").write_text(
        "raise ImportError(\"No module named 'ray' (hidden by the test)\")\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), env.get("PYTHONPATH")]))
    return env


def test_replicas_without_ray_exit_with_the_install_hint(tiny_dir, no_ray_env):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loragate.gateway.assembly.cli",
            "serve",
            "--model",
            str(tiny_dir),
            "--port",
            "0",
            "--replicas",
            "2",
        ],
        env=no_ray_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "pip install 'loragate[ray]'" in done.stderr, done.stderr
    assert "hidden by the test" in done.stderr  # it names why Ray could not be imported
    assert "starting the engine" not in done.stderr  # refused before any model loads


def test_the_single_process_server_needs_no_ray(tiny_dir, no_ray_env):
    script = (
        "import sys\n"
        "from loragate.engine import EngineConfig\n"
        "from loragate.gateway.assembly.server import BackgroundServer\n"
        "from loragate.gateway.settings import GatewaySettings\n"
        "import httpx\n"
        f"settings = GatewaySettings(engine=EngineConfig(model={str(tiny_dir)!r}, "
        "num_kv_blocks=64, max_model_len=256), port=0)\n"
        "with BackgroundServer(settings) as server:\n"
        "    got = httpx.post(server.url + '/v1/completions', json={'model': '', 'prompt': 'Hi', "
        "'max_tokens': 2}, timeout=60)\n"
        "    assert got.status_code == 200, got.text\n"
        "    print(got.status_code, got.json()['usage']['completion_tokens'])\n"
        "print('ray' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=no_ray_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "2", "False"], done.stdout


def test_replica_settings_are_checked():
    assert not GatewaySettings().replicated
    assert GatewaySettings(replicas=2).replicated
    assert GatewaySettings(min_replicas=1, max_replicas=3).replicated
    for bad, named in [
        (dict(replicas=0), "replicas"),
        (dict(min_replicas=3, max_replicas=2), "min_replicas"),
        (dict(replicas=5, min_replicas=1, max_replicas=3), "replicas (5)"),
        (dict(replicas=2, target_ongoing_requests=0), "target_ongoing_requests"),
        (dict(replicas=2, replica_cpus=-1), "replica_cpus"),
        (dict(replicas=2, ray_address=""), "ray_address"),
    ]:
        with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
            GatewaySettings(**bad)

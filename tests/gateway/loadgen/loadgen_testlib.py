"""What the load-generator tests share (issue 62): the tools' own venvs (`make loadgen`), the
server's per-adapter counters, and the replay of every field a tool sent. Imported by bare
name (pytest puts a test's own folder on sys.path)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from gateway_testlib import metrics, wait_until

REPO = Path(__file__).resolve().parents[3]
LOADGEN = REPO / ".loadgen"
MISSING = (
    "{tool} is not installed in {venv}: run `make loadgen` (each tool in its own venv, "
    "pinned in .ci/loadgen/{tool}.txt; .ci/run does it before the tests)"
)


def tool_bin(tool: str, command: str) -> Path:
    """The tool's command in its own venv. Missing: a failure where CI requires the tools
    (LORAGATE_REQUIRE_LOADGEN=1, set by .ci/run), else a skip that says how to install it."""
    path = LOADGEN / tool / "bin" / command
    if not (LOADGEN / tool / ".installed").exists() or not path.exists():
        message = MISSING.format(tool=tool, venv=LOADGEN / tool)
        if os.environ.get("LORAGATE_REQUIRE_LOADGEN") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def run_tool(args: list, cwd: Path, offline_flags: bool = True) -> str:
    """Run a tool's CLI unchanged in its own venv, its output (or a failure that shows it).
    Never on the hub: every tokenizer is a local folder, the hub's address unreachable, and
    the offline flags set, unless `offline_flags` is False (aiperf 0.13 reads any value of
    HF_HUB_OFFLINE, even "0", as offline, and then takes a local folder for a hub id)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    for flag in OFFLINE:
        env.pop(flag, None)
        if offline_flags:
            env[flag] = "1"
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{output[-4000:]}"
    return output


_COUNTER = re.compile(r'^loragate_adapter_(\w+)_total\{adapter="([^"]*)",model_name="[^"]*"\}$')


def bearer(key: str | None) -> dict:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def adapter_counters(url: str, admin_key: str | None) -> dict[tuple[str, str], float]:
    """(adapter, requests | prompt_tokens | generation_tokens) -> the server's counter."""
    found = {}
    for key, value in metrics(url, bearer(admin_key)).items():
        match = _COUNTER.match(key)
        if match and match.group(1) in ("requests", "prompt_tokens", "generation_tokens"):
            found[(match.group(2), match.group(1))] = value
    return found


def counted_since(
    url: str, admin_key: str | None, before: dict, requests: int
) -> dict[str, dict[str, int]]:
    """Per adapter, what the server counted since `before`, once it has counted `requests`
    requests (a request is counted as it closes, which may follow its last byte)."""

    def delta():
        now = adapter_counters(url, admin_key)
        out: dict[str, dict[str, int]] = {}
        for (adapter, what), value in now.items():
            grown = int(value - before.get((adapter, what), 0))
            if grown:
                out.setdefault(adapter, {})[what] = grown
        total = sum(d.get("requests", 0) for d in out.values())
        return out if total >= requests else None

    return wait_until(delta, f"the server to count {requests} requests", timeout=60)


def minimal_body(path: str, body: dict) -> dict:
    """The smallest valid request to `path` for the body's model, streamed as it was."""
    minimal = {"model": body["model"], "max_tokens": 2, "stream": bool(body.get("stream"))}
    if path.endswith("/chat/completions"):
        minimal["messages"] = [{"role": "user", "content": "Hi"}]
    else:
        minimal["prompt"] = "Hi"
    return minimal


def _answer(url: str, key: str | None, path: str, body: dict) -> tuple[int, str]:
    with httpx.stream(
        "POST", f"{url}{path}", json=body, headers=bearer(key), timeout=120
    ) as response:
        text = response.read().decode()
    return response.status_code, text


def replay_fields(url: str, key: str | None, sent: list[tuple[str, dict]]) -> set[tuple[str, str]]:
    """Every field a tool sent, accepted (must-show 3): each recorded request replayed whole,
    then each of its fields alone on the smallest request to that route (with `stream`, as
    vLLM wants it, where the field was sent on a stream). A refusal, or an error event
    inside a stream answered 200, fails. Returns the (route, field) pairs checked."""
    checked: set[tuple[str, str]] = set()
    for path, body in sent:
        status, text = _answer(url, key, path, body)
        assert status == 200, f"{path} refused the tool's request {body}: {text[:500]}"
        assert '"error"' not in text, f"{path} sent an error for {body}: {text[:500]}"
        for field, value in body.items():
            if (path, field) in checked:
                continue
            checked.add((path, field))
            single = {**minimal_body(path, body), field: value}
            if field == "max_completion_tokens":
                single.pop("max_tokens")
            status, text = _answer(url, key, path, single)
            assert status == 200, f"{path} refused field {field}={value!r}: {text[:500]}"
            assert '"error"' not in text, f"{path}: {field}={value!r} sent {text[:500]}"
    return checked


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

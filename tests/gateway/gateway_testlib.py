"""Helpers for the gateway tests: a tiny model on disk, metric scraping, SSE parsing."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
from tiny_llama import save_tiny_model

# Engine settings of the test servers (and of the offline reference engine).
ENGINE = dict(
    max_model_len=512,
    max_num_seqs=64,
    max_num_batched_tokens=1024,
    num_kv_blocks=512,
    block_size=16,
    enable_lora=True,
    max_loras=4,
    max_lora_rank=8,
    max_cpu_loras=8,
)

ADAPTER_NAMES = ("alpha", "beta", "gamma", "delta")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_tiny_model_dir(out: Path, tokenizer_dir: Path) -> Path:
    """The shared tiny test model (tests/tiny_llama.py) with the default model's tokenizer."""
    return save_tiny_model(out, tokenizer_dir)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metrics(url: str, headers: dict | None = None) -> dict[str, float]:
    """Every sample of GET /metrics: 'name{labels}' -> value."""
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    found = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            found[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return found


def wait_until(predicate, what: str, timeout: float = 120.0, every: float = 0.05):
    """Poll until `predicate()` is truthy; a bound on waiting, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)


def kv_idle(url: str) -> bool:
    m = metrics(url)
    return (
        m["loragate_kv_cache_allocated_blocks"] == 0
        and m["loragate_num_requests_running"] == 0
        and m["loragate_num_requests_waiting"] == 0
        and m["loragate_gateway_requests_in_flight"] == 0
    )


def sse_payloads(lines) -> list:
    """The JSON bodies of `data:` lines, stopping at [DONE]."""
    out = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        out.append(json.loads(data))
    return out

"""`loragate serve --replicas 2` as deployed: a real process that starts a local Ray cluster
with two replicas, serves, and on SIGTERM drains the running request, removes the replicas
and stops the cluster (no Ray process outlives it)."""

from __future__ import annotations

import json
import signal

import httpx
import psutil
import pytest
from servers_testlib import ServeProcess

pytestmark = pytest.mark.ray


def test_sigterm_drains_the_replicas_and_stops_the_local_cluster(tiny_dir):
    server = ServeProcess(
        "--model",
        str(tiny_dir),
        "--replicas",
        "2",
        "--replica-cpus",
        "0.5",
        "--num-kv-blocks",
        "128",
        "--max-model-len",
        "1024",
    )
    try:
        replicas = httpx.get(f"{server.url}/v1/replicas", timeout=30).json()
        assert replicas["mode"] == "ray" and len(replicas["data"]) == 2, replicas
        cluster = psutil.Process(server.proc.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in cluster), [p.name() for p in cluster]
        body = {
            "model": "",
            "prompt": "Go on",
            "max_tokens": 300,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        with (
            httpx.Client(timeout=120) as client,
            client.stream("POST", f"{server.url}/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data:")]
        assert rest[-1] == "data: [DONE]"
        finishes = [json.loads(x[5:])["choices"][0]["finish_reason"] for x in rest[:-1]]
        assert finishes[-1] == "length", "the running request was cut, not drained"
        assert server.proc.wait(120) in (0, -signal.SIGTERM)
        _, alive = psutil.wait_procs(cluster, timeout=30)
        assert not alive, f"Ray processes outlived the server: {[p.name() for p in alive]}"
    finally:
        server.stop()

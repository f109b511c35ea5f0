"""Autoscaling from the requests in flight (issue 46, must-show 3), on a local Ray cluster.

`min_replicas` 1, `max_replicas` 2, two requests in flight per replica as the target, and
short delays and window (the defaults are Ray Serve's: 30 s up, 600 s down). A burst of
long streams (eight in flight, each replaced as it ends) brings the second replica up, and
requests are routed to it; once the burst ends and the deployment idles, it goes back to
one replica, a leaving replica finishing its streams first. No request fails at any point.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import httpx
import pytest
import ray  # the `ray` extra, in `dev`
from gateway_testlib import wait_until
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api

from loragate.gateway.replicas.cluster import RayReplicas
from loragate.gateway.settings import GatewaySettings

pytestmark = pytest.mark.ray


def test_delays_and_window_become_ray_serve_options():
    settings = GatewaySettings(
        min_replicas=1,
        max_replicas=2,
        target_ongoing_requests=2,
        upscale_delay_seconds=0.5,
        downscale_delay_seconds=4,
        autoscaling_window_seconds=2,
    )
    assert RayReplicas(settings).scaling_options() == {
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 2,
            "initial_replicas": 1,
            "target_ongoing_requests": 2,
            "upscale_delay_s": 0.5,
            "downscale_delay_s": 4,
            "look_back_period_s": 2,
        }
    }
    for bad in (0, -1, True, "5"):
        with pytest.raises(ValueError, match="downscale_delay_seconds"):
            GatewaySettings(min_replicas=1, max_replicas=2, downscale_delay_seconds=bad)


def _stream(api: Api, model: str, outcomes: list, lock: threading.Lock) -> None:
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
    }
    ended = None
    with httpx.stream(
        "POST", f"{api.url}/v1/completions", json=body, headers=api.headers, timeout=180
    ) as response:
        status = response.status_code
        for line in response.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                event = json.loads(line[len("data:") :])
                if "error" in event:
                    ended = event["error"]
                for choice in event.get("choices", []):
                    ended = choice["finish_reason"] or ended
    with lock:
        outcomes.append((status, ended))


def test_a_burst_scales_up_and_idleness_back_down(tiny_dir, redis_url):
    namespace = f"test-ray-autoscale-{uuid.uuid4().hex}"
    server = start_tiny_server(
        tiny_dir,
        {},
        redis_url=redis_url,
        redis_namespace=namespace,
        admin_key=ADMIN_KEY,
        min_replicas=1,
        max_replicas=2,
        target_ongoing_requests=2,
        replica_cpus=0.5,
        upscale_delay_seconds=0.5,
        downscale_delay_seconds=4,
        autoscaling_window_seconds=2,
    )
    try:
        admin = Api(server.url, ADMIN_KEY)

        def replicas() -> list[dict]:
            got = admin.get("/v1/replicas")
            assert got.status_code == 200, got.text
            return got.json()["data"]

        wait_until(lambda: len(replicas()) == 1, "the first replica", 120, 0.5)
        first, base = replicas()[0]["id"], admin.base_model()
        outcomes: list = []
        lock = threading.Lock()
        stop = threading.Event()

        def burst() -> None:  # eight streams in flight until told to stop
            running: list[threading.Thread] = []
            while not stop.is_set():
                running = [t for t in running if t.is_alive()]
                while len(running) < 8:
                    t = threading.Thread(target=_stream, args=(admin, base, outcomes, lock))
                    t.start()
                    running.append(t)
                time.sleep(0.05)
            for t in running:
                t.join(180)

        bursting = threading.Thread(target=burst)
        bursting.start()
        try:
            wait_until(
                lambda: any(r["id"] != first and r["running"] > 0 for r in replicas()),
                "a second replica serving part of the burst",
                180,
                0.2,
            )
        finally:
            stop.set()
            bursting.join(240)
        assert not bursting.is_alive(), "a stream of the burst hung"

        wait_until(lambda: len(replicas()) == 1, "back to one replica when idle", 180, 0.5)
        assert outcomes, "no stream ran"
        failed = [o for o in outcomes if o != (200, "length")]
        assert not failed, failed
        got = admin.complete(admin.base_model())
        assert got.status_code == 200, got.text
    finally:
        server.stop()
        flush_namespace(namespace, redis_url)
    assert not ray.is_initialized(), "the local Ray cluster outlived the server"

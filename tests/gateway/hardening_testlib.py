"""Helpers of the hardening tests (test_hardening.py): checks that the other tenants are
still served, adapter copies with a changed config, and raw sockets for
the slow-client tests. Imported by bare name (tests/gateway is on sys.path)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import httpx
from gateway_testlib import metrics, wait_until
from tenancy_testlib import Api


def others_still_served(tenants: dict, admin: Api) -> None:
    """Every tenant's request succeeds, /health is ok and no KV block is left allocated."""
    for tenant, api in tenants.items():
        got = api.complete(f"{tenant}-good")
        assert got.status_code == 200, got.text
        assert got.json()["choices"][0]["text"] is not None
    health = httpx.get(f"{admin.url}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    headers = admin.headers

    def idle() -> bool:
        m = metrics(admin.url, headers)
        return m["loragate_kv_cache_allocated_blocks"] == 0 and (
            m["loragate_num_requests_running"] == 0
        )

    wait_until(idle, "every KV block freed", 30)


def adapter_copy(root: Path, tenant: str, name: str, **config_changes) -> str:
    """A copy of the tenant's good adapter with adapter_config.json changed; its path."""
    folder = root / tenant / name
    shutil.copytree(root / tenant / "good", folder)
    config_file = folder / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(config_changes)
    config_file.write_text(json.dumps(config))
    return name


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def closed_after(sock: socket.socket, trickle: list[bytes], every: float) -> float:
    """Send `trickle` one piece every `every` seconds until the server closes; seconds."""
    started = time.monotonic()
    sock.settimeout(every)
    for piece in trickle:
        try:
            sock.sendall(piece)
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started
    raise AssertionError("the server kept the slow connection open")


def is_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True

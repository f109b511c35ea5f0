"""The servers a benchmark runs in subprocesses (`loragate serve`, vLLM's api_server,
llama-server, the gateways of the registry and upload runs): a free port to start one on,
waiting until one serves, and stopping one."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(server, ready_url: str, name: str, log_path: Path, timeout_s: float):
    """Poll ``ready_url`` until it answers 200; stop ``server`` (a peer with ``proc`` and
    ``stop``) and raise if its process exits or ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"{name} did not start; see {log_path}")
        try:
            if httpx.get(ready_url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def stop_process(proc: subprocess.Popen, log: IO, grace_s: float) -> None:
    """Terminate ``proc`` if it runs, kill it if it has not exited within ``grace_s``
    seconds, and close its ``log``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()

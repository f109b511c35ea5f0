"""How the gateway tests build their servers: the tiny model with the test engine settings,
on a free port, in a background thread. Imported by bare name (tests/gateway is on
sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from gateway_testlib import ENGINE

from loragate.engine import EngineConfig
from loragate.gateway.assembly.server import BackgroundServer
from loragate.gateway.settings import GatewaySettings


def tiny_settings(tiny_dir: Path, engine: dict | None = None, **gateway) -> GatewaySettings:
    """Settings for the tiny model: ENGINE with `engine`'s overrides, port 0, and `gateway`."""
    config = EngineConfig(model=str(tiny_dir), **{**ENGINE, **(engine or {})})
    return GatewaySettings(engine=config, port=0, **gateway)


def start_tiny_server(tiny_dir: Path, engine: dict | None = None, **gateway) -> BackgroundServer:
    """A running server on the tiny model; stop it with `.stop()`."""
    return BackgroundServer(tiny_settings(tiny_dir, engine, **gateway)).start()


CLI_MODULE = "loragate.gateway.assembly.cli"


class ServeProcess:
    """`python -m loragate.gateway.assembly.cli serve ...`, its output collected on threads."""

    def __init__(self, *args, env: dict | None = None):
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CLI_MODULE, "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.listening = threading.Event()
        threading.Thread(
            target=self._read, args=(self.proc.stdout, self.stdout), daemon=True
        ).start()
        threading.Thread(
            target=self._read, args=(self.proc.stderr, self.stderr), daemon=True
        ).start()
        if not self.listening.wait(300) or not any("listening on" in x for x in self.stdout):
            self.proc.kill()
            raise AssertionError("server did not start:\n" + "".join(self.stderr[-30:]))
        line = next(line for line in self.stdout if "listening on" in line)
        self.url = line.split("listening on", 1)[1].strip()

    def _read(self, pipe, into):
        for line in pipe:
            into.append(line)
            if "listening on" in line:
                self.listening.set()
        self.listening.set()  # the process ended: stop waiting for it to listen

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

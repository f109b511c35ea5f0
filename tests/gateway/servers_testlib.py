"""How the gateway tests build their servers: the tiny model with the test engine settings,
on a free port, in a background thread. Imported by bare name (tests/gateway is on
sys.path)."""

from __future__ import annotations

from pathlib import Path

from gateway_testlib import ENGINE

from loragate.engine import EngineConfig
from loragate.gateway import BackgroundServer, GatewaySettings


def tiny_settings(tiny_dir: Path, engine: dict | None = None, **gateway) -> GatewaySettings:
    """Settings for the tiny model: ENGINE with `engine`'s overrides, port 0, and `gateway`."""
    config = EngineConfig(model=str(tiny_dir), **{**ENGINE, **(engine or {})})
    return GatewaySettings(engine=config, port=0, **gateway)


def start_tiny_server(tiny_dir: Path, engine: dict | None = None, **gateway) -> BackgroundServer:
    """A running server on the tiny model; stop it with `.stop()`."""
    return BackgroundServer(tiny_settings(tiny_dir, engine, **gateway)).start()

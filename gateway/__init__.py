"""loragate.gateway: the HTTP API (Litestar + msgspec), in folders by concern: the openai/,
tgi/ and admin/ protocols, serving/ (one generation, metering, admission), adapter_control/,
tenancy/ (see TENANCY.md) and operations/ (CLI, settings, metrics, server start)."""

import os

# OpenMP workers (torch's GNU libgomp) spin this many iterations waiting for the next
# parallel region, then sleep. libgomp's default (300,000) keeps idle workers spinning so
# long that any other busy thread on the machine (the server's event loop, a neighbour)
# starves the step: measured on 2 cores under load, the tiny model's decode step took
# 27-43 ms with the default and 5.8-7.0 ms with 50,000, about what it takes on a quiet
# machine (BENCHMARKS.md, "The engine's own time"). Read when torch loads libgomp, so it
# is set before anything imports torch; a value in the environment wins.
os.environ.setdefault("GOMP_SPINCOUNT", "50000")

from loragate.gateway.app import create_app
from loragate.gateway.operations.server import BackgroundServer, build_server, serve
from loragate.gateway.operations.settings import GatewaySettings

__all__ = ["BackgroundServer", "GatewaySettings", "build_server", "create_app", "serve"]

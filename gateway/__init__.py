"""loragate.gateway: the HTTP API (Litestar + msgspec), in folders by concern: the openai/,
tgi/ and admin/ protocols, serving/ (one generation, metering, admission), adapter_control/,
tenancy/ (see TENANCY.md) and operations/ (CLI, settings, metrics, server start)."""

from loragate.gateway.app import create_app
from loragate.gateway.operations.server import BackgroundServer, build_server, serve
from loragate.gateway.operations.settings import GatewaySettings

__all__ = ["BackgroundServer", "GatewaySettings", "build_server", "create_app", "serve"]

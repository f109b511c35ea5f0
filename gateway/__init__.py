"""loragate.gateway: the HTTP API (Litestar + msgspec), in parts by concern, each importing
only those before it: errors and the store seam, tenancy/ (see TENANCY.md),
adapter_control/, serving/ (the served model, generations, metering, admission), the
openai/, tgi/ and admin/ protocols, settings, replicas/, and operations/ (the app factory,
CLI, metrics, server start)."""

from loragate.gateway.operations.app import create_app
from loragate.gateway.operations.server import BackgroundServer, build_server, serve
from loragate.gateway.settings import GatewaySettings

__all__ = ["BackgroundServer", "GatewaySettings", "build_server", "create_app", "serve"]

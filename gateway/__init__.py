"""loragate.gateway: the HTTP API (Litestar + msgspec), tenants and quotas, the replica-local
adapter copy of the registry store, CLI and server start (see TENANCY.md)."""

from loragate.gateway.app import create_app
from loragate.gateway.operations.server import BackgroundServer, build_server, serve
from loragate.gateway.operations.settings import GatewaySettings

__all__ = ["BackgroundServer", "GatewaySettings", "build_server", "create_app", "serve"]

"""Litestar guards for admin-only routes: they run before the handler, so a route never
starts work a tenant may not ask for."""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from loragate.gateway.errors import InvalidRequestError, PermissionDeniedError
from loragate.gateway.tenancy.principal import caller_of

ADMIN_ONLY = "this endpoint needs the admin key"


def admin_only(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    """403 unless the caller holds the admin key (the handler's `opt` may say why)."""
    if not caller_of(connection).is_operator:
        message = handler.opt.get("admin_only", ADMIN_ONLY)
        raise PermissionDeniedError(message, code="admin_only")


def tenancy_enabled(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """400 on an open server: it has no tenants to manage."""
    if not connection.app.state.services.auth.enabled:  # the app's Authenticator
        raise InvalidRequestError(
            "tenants need an admin key: this server runs open (single-tenant); start it with "
            "--admin-key to manage tenants",
            code="tenancy_disabled",
        )

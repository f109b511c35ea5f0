"""A plugin observer behind the gateway sees the tenant's own name (issue 12), not the
prefix-cache salt the gateway also passes; the operator's requests name no tenant."""

from __future__ import annotations

import gateway_test_plugin
from tenancy_testlib import ADMIN_KEY, Api


def test_an_observer_sees_the_authenticated_tenants_name(start_server):
    server = start_server(
        gateway={"admin_key": ADMIN_KEY}, plugins=("gateway_test_plugin:TENANT_OBSERVER",)
    )
    observer = gateway_test_plugin.TENANT_OBSERVER
    observer.tenants.clear()
    admin = Api(server.url, ADMIN_KEY)
    acme = admin.as_key(admin.create_tenant("acme"))
    for caller in (acme, admin):
        got = caller.complete(caller.base_model())
        assert got.status_code == 200, got.text
    assert observer.tenants == ["acme", None]

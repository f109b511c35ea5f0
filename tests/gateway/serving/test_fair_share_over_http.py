"""Fair share over real HTTP (issue 17): a tenant's `weight` is set and checked through the
admin routes and reaches the engine with the tenant's name and vLLM's `priority` field,
and the per-tenant service counters on /metrics add up what each tenant was served."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import gateway_test_plugin
from click.testing import CliRunner
from gateway_testlib import metrics
from tenancy_testlib import ADMIN_KEY, Api

from loragate.engine import SCHEDULING_POLICIES
from loragate.gateway.assembly.cli import main as cli


def test_weight_tenant_and_priority_reach_the_fair_scheduler(start_server):
    server = start_server(
        gateway={"admin_key": ADMIN_KEY},
        plugins=("gateway_test_plugin:ADMISSION_OBSERVER",),
        scheduling_policy="fair",
        max_num_seqs=1,  # one request runs at a time: the others wait and are ordered
    )
    observer = gateway_test_plugin.ADMISSION_OBSERVER
    admin = Api(server.url, ADMIN_KEY)

    created = admin.post("/v1/tenants", {"name": "acme", "weight": 3})
    assert created.status_code == 201, created.text
    assert created.json()["tenant"]["weight"] == 3.0
    acme = admin.as_key(created.json()["api_key"])
    globex = admin.as_key(admin.create_tenant("globex"))
    assert admin.get("/v1/tenants/globex").json()["weight"] == 1.0

    for body in ({"name": "zero", "weight": 0}, {"name": "text", "weight": "heavy"}):
        refused = admin.post("/v1/tenants", body)
        assert refused.status_code == 400, refused.text
        assert "weight" in refused.text
    assert admin.get("/v1/tenants/zero").status_code == 404  # nothing was created
    for body in ({"weight": -1}, {}):
        refused = admin.patch("/v1/tenants/globex", body)
        assert refused.status_code == 400, refused.text
    assert admin.patch("/v1/tenants/nobody", {"weight": 2}).status_code == 404
    changed = admin.patch("/v1/tenants/globex", {"weight": 0.5})
    assert changed.status_code == 200, changed.text
    assert changed.json()["weight"] == 0.5
    assert changed.json()["quota"] == admin.get("/v1/tenants/acme").json()["quota"]  # kept

    model = admin.base_model()
    calls = [(acme, {"priority": 2})] * 3 + [(globex, {})] * 3
    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(lambda c: c[0].complete(model, max_tokens=8, **c[1]), calls))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    bad = acme.complete(model, priority="high")
    assert bad.status_code == 400, bad.text

    seen = {}
    for tenants in observer.tenants:
        assert tenants["policy"] == "fair"
        seen.update({k: v["weight"] for k, v in tenants.items() if k != "policy"})
    assert seen == {"acme": 3.0, "globex": 0.5}
    acme_entries = [e for e in observer.entries if e["tenant"] == "acme"]
    assert acme_entries and all(e["priority"] == 2 for e in acme_entries)

    samples = metrics(server.url, headers=admin.headers)
    served = {
        tenant: samples.get(
            f'loragate_tenant_service_tokens_total{{model_name="{model}",tenant="{tenant}"}}', 0
        )
        for tenant in ("acme", "globex")
    }
    expected = {"acme": 0, "globex": 0}
    for (caller, _), answer in zip(calls, answers, strict=True):
        usage = answer.json()["usage"]
        tenant = "acme" if caller is acme else "globex"
        expected[tenant] += usage["prompt_tokens"] + 2 * usage["completion_tokens"]
    assert served == expected  # prompt tokens count 1, generated tokens 2


def test_serve_offers_every_scheduling_policy():
    help_text = CliRunner().invoke(cli, ["serve", "--help"]).output
    for policy in SCHEDULING_POLICIES:
        assert policy in help_text
    refused = CliRunner().invoke(cli, ["serve", "--scheduling-policy", "lottery"])
    assert refused.exit_code != 0 and "'lottery' is not one of" in refused.output

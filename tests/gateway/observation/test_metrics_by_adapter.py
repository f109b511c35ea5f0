"""Per-adapter and per-tenant metrics over real HTTP: a mixed run's per-adapter counters add
up to the `vllm:` totals and to the engine's own, an adapter beyond --metrics-label-limit is
counted under `__other__`, each adapter's tier shows, and `vllm:lora_requests_info` names
the running and waiting adapters mid-run."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from gateway_test_plugin import GatedPlugin
from gateway_testlib import ADAPTER_NAMES, kv_idle, metrics, wait_until


def series(m: dict[str, float], name: str) -> dict[str, float]:
    """{labels text: value} of every sample of `name`."""
    return {k[len(name) :]: v for k, v in m.items() if k.split("{")[0] == name}


def by_label(m: dict[str, float], name: str, label: str) -> dict[str, float]:
    found = {}
    for labels, value in series(m, name).items():
        match = re.search(rf'{label}="([^"]*)"', labels)
        if match:
            found[match.group(1)] = found.get(match.group(1), 0) + value
    return found


def complete(url: str, model: str, max_tokens: int = 5, **extra) -> httpx.Response:
    body = {
        "model": model,
        "prompt": f"Hello {model}",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120)


@pytest.fixture(scope="module")
def mixed(start_server):
    """A server of its own (counters from zero), labels for two adapters only, and a mixed
    run: every adapter and the base model, streamed and not."""
    server = start_server(gateway={"metrics_label_limit": 2})
    url = server.url
    base = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    plan = [ADAPTER_NAMES[0], ADAPTER_NAMES[1], base, ADAPTER_NAMES[2], ADAPTER_NAMES[0]]
    plan += [ADAPTER_NAMES[3], base]
    for i, model in enumerate(plan):
        got = complete(url, model, max_tokens=3 + i, stream=i % 2 == 1)
        assert got.status_code == 200, got.text
    wait_until(lambda: kv_idle(url), "idle")
    return url, base, plan, metrics(url)


def test_per_adapter_counters_add_up_to_the_totals(mixed):
    url, base, plan, m = mixed
    for kind in ("prompt_tokens", "generation_tokens"):
        total = sum(series(m, f"vllm:{kind}_total").values())
        assert total > 0
        assert sum(by_label(m, f"loragate_adapter_{kind}_total", "adapter").values()) == total
        assert sum(by_label(m, f"loragate_tenant_{kind}_total", "tenant").values()) == total
        assert m[f"loragate_{kind}_total"] == total  # the engine's own count agrees
    requests = by_label(m, "loragate_adapter_requests_total", "adapter")
    assert sum(requests.values()) == len(plan)
    assert by_label(m, "loragate_tenant_requests_total", "tenant") == {"default": len(plan)}
    generated = by_label(m, "loragate_adapter_generation_tokens_total", "adapter")
    assert generated["__base__"] == (3 + 2) + (3 + 6)


def test_adapters_beyond_the_label_limit_are_counted_as_other(mixed):
    url, base, plan, m = mixed
    requests = by_label(m, "loragate_adapter_requests_total", "adapter")
    # the first two adapters to serve keep their names; the other two share one series
    assert requests == {"alpha": 2, "beta": 1, "__base__": 2, "__other__": 2}


def test_latency_histograms_count_every_request(mixed):
    url, base, plan, m = mixed
    assert sum(series(m, "vllm:time_to_first_token_seconds_count").values()) == len(plan)
    assert sum(series(m, "vllm:request_queue_time_seconds_count").values()) == len(plan)
    adapter_ttft = by_label(m, "loragate_adapter_time_to_first_token_seconds_count", "adapter")
    assert sum(adapter_ttft.values()) == len(plan)
    # one gap per token after the first: sum over requests of (max_tokens - 1)
    gaps = sum(2 + i for i in range(len(plan)))
    assert sum(series(m, "vllm:inter_token_latency_seconds_count").values()) == gaps
    tenant_itl = by_label(m, "loragate_tenant_inter_token_latency_seconds_count", "tenant")
    assert tenant_itl == {"default": gaps}
    success = by_label(m, "vllm:request_success_total", "finished_reason")
    assert success == {"length": len(plan)}


def test_each_named_adapter_shows_its_tier_and_all_are_counted_per_tier(mixed):
    url, base, plan, m = mixed
    tiers = {}
    for labels, value in series(m, "loragate_adapter_tier").items():
        adapter = re.search(r'adapter="([^"]*)"', labels).group(1)
        tier = re.search(r'tier="([^"]*)"', labels).group(1)
        assert value == 1
        tiers[adapter] = tier
    assert set(tiers) == {"alpha", "beta"}  # only adapters with a label of their own
    assert set(tiers.values()) <= {"device", "cpu", "disk"}
    counts = by_label(m, "loragate_adapters_by_tier", "tier")
    # Every registered adapter is in one tier (the shared adapter root may hold more than
    # the four test adapters: other tests write adapters into it).
    assert sum(counts.values()) == m["loragate_adapters_registered"] >= len(ADAPTER_NAMES)
    assert counts["device"] >= 1  # adapters just served sit in device slots (max_loras 4)
    loads = series(m, "loragate_adapter_weight_loads_total")
    seconds = series(m, "loragate_adapter_weight_load_seconds_total")
    for name in ("alpha", "beta"):  # read from disk when registered, then put in a slot
        for tier in ("cpu", "device"):
            labels = f'{{adapter="{name}",model_name="{base}",tier="{tier}"}}'
            assert loads[labels] >= 1, labels
            assert seconds[labels] > 0, labels
    assert not [k for k in loads if "gamma" in k or "delta" in k]  # no label of their own


def test_vllm_gauges_carry_the_model_name(mixed):
    url, base, plan, m = mixed
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert series(m, name) == {f'{{model_name="{base}"}}': 0}
    assert f'vllm:kv_cache_usage_perc{{model_name="{base}"}}' in m


def test_lora_requests_info_names_running_and_waiting_adapters_mid_run(start_server):
    """One sequence at a time: one adapter runs while the others wait. The requests' steps
    are the test's to give (a permit each), and until the info names a running and a
    waiting adapter they are given fewer than one request needs, one at a time (a request
    or a scrape reaches the engine between two steps): none has ended when it is read."""
    gate = GatedPlugin()
    url = start_server(plugins=(gate,), max_num_seqs=1).url
    needs = 100
    results = []

    def call(name: str) -> None:
        got = complete(url, name, max_tokens=needs, sampler="gated_greedy")
        results.append(got.status_code)

    threads = [threading.Thread(target=call, args=(n,)) for n in ADAPTER_NAMES[:3]]
    for t in threads:
        t.start()

    def info_mid_run():
        for labels in series(metrics(url), "vllm:lora_requests_info"):
            running = re.search(r'running_lora_adapters="([^"]*)"', labels).group(1)
            waiting = re.search(r'waiting_lora_adapters="([^"]*)"', labels).group(1)
            if running and waiting:
                return labels, running, waiting.split(",")
        return None

    labels, running, waiting = gate.answer(
        lambda: wait_until(info_mid_run, "running and waiting adapters"), short_of=needs
    )
    gate.open()
    for t in threads:
        t.join()
    assert results == [200, 200, 200]
    assert running in ADAPTER_NAMES[:3]
    assert running not in waiting and set(waiting) <= set(ADAPTER_NAMES[:3])
    assert 'max_lora="4"' in labels
    idle = series(metrics(url), "vllm:lora_requests_info")
    assert list(idle) == ['{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""}']


def test_the_grafana_dashboard_reads_only_series_the_server_exports(mixed):
    url, base, plan, m = mixed
    path = Path(__file__).parents[3] / "examples" / "grafana" / "loragate-dashboard.json"
    dashboard = json.loads(path.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    names = {n for e in exprs for n in re.findall(r"(vllm:[a-z_:]+|loragate_[a-z_]+)", e)}
    exported = {k.split("{")[0] for k in m}
    assert len(names) >= 15
    assert sorted(names - exported) == []

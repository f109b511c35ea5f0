"""An adapter larger than a whole memory tier (here the device slots, --max-lora-bytes) is
refused when registered: a 400 naming its size, the tier's and the option to raise, nothing
registered; adapters that fit are served beside it (issue 45: adapters count at their real
size)."""

from __future__ import annotations

import httpx
from adapter_kinds_testlib import kind_specs, make_kind
from gateway_testlib import TARGETS

from loragate.tools import make_random_adapter

LIMIT = 4_000_000  # bytes of device slots: a plain adapter fits, whole matrices do not


def test_an_adapter_larger_than_the_slots_is_refused_naming_the_sizes(
    start_server, tmp_path, tiny_hf
):
    root = tmp_path / "root"
    make_kind(tiny_hf, root / "big", kind_specs([5])["saved"], seed=3)
    make_random_adapter(tiny_hf, root / "small", rank=4, targets=TARGETS, seed=4)
    server = start_server(
        gateway={"adapter_root": root, "preload_adapters": False}, max_lora_bytes=LIMIT
    )
    refused = httpx.post(
        f"{server.url}/v1/adapters", json={"name": "big", "path": "big"}, timeout=60
    )
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_adapter"
    message = error["message"]
    assert "device slots" in message and str(LIMIT) in message and "max_lora_bytes" in message
    assert "MB" in message and str(root) not in message
    listed = httpx.get(f"{server.url}/v1/adapters").json()["data"]
    assert "big" not in {a["name"] for a in listed}
    created = httpx.post(
        f"{server.url}/v1/adapters", json={"name": "small", "path": "small"}, timeout=60
    )
    assert created.status_code == 201, created.text
    body = {"model": "small", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200

"""Register, list, use and delete adapters over REST; escapes from the adapter root refused."""

from __future__ import annotations

import json
import os
import threading

import httpx
import pytest
from gateway_testlib import TARGETS, sse_payloads, wait_until

from loragate.tools import make_random_adapter


@pytest.fixture(scope="module")
def own_root(tmp_path_factory, tiny_hf):
    """A fresh adapter root (and an adapter outside it) for tests that plant files."""
    base = tmp_path_factory.mktemp("rest")
    root = base / "root"
    root.mkdir()
    make_random_adapter(tiny_hf, root / "inside", rank=4, targets=TARGETS, seed=11, init_scale=0.5)
    make_random_adapter(tiny_hf, base / "outside", rank=4, targets=TARGETS, seed=12)
    return root


@pytest.fixture(scope="module")
def own(start_server, own_root):
    return start_server(gateway={"adapter_root": own_root, "preload_adapters": False})


def post_adapter(url, name, path, **kw):
    body = {"name": name, "path": path, **kw}
    return httpx.post(f"{url}/v1/adapters", json=body, timeout=60)


def complete(url, model, prompt="Hello world", **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0, **kw}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60)


def test_register_list_use_delete(url, adapter_root):
    created = post_adapter(url, "epsilon", "alpha")
    assert created.status_code == 201, created.text
    info = created.json()
    assert info["name"] == "epsilon" and info["path"] == "alpha" and info["rank"] == 4
    assert set(info["target_modules"]) == set(TARGETS)
    assert str(adapter_root) not in created.text

    listed = httpx.get(f"{url}/v1/adapters").json()["data"]
    assert "epsilon" in [a["name"] for a in listed]
    assert httpx.get(f"{url}/v1/adapters/epsilon").json()["id"] == info["id"]
    assert "epsilon" in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]

    # Same weights as `alpha` under a new name: the same tokens.
    used = complete(url, "epsilon")
    assert used.status_code == 200
    assert used.json()["choices"][0]["text"] == complete(url, "alpha").json()["choices"][0]["text"]

    deleted = httpx.delete(f"{url}/v1/adapters/epsilon", timeout=60)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert httpx.get(f"{url}/v1/adapters/epsilon").status_code == 404
    gone = complete(url, "epsilon")
    assert gone.status_code == 404
    assert gone.json()["error"]["param"] == "model"
    assert "epsilon" not in [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]]
    assert httpx.delete(f"{url}/v1/adapters/epsilon").status_code == 404


def test_reregistering_a_name_gets_a_new_id(url):
    first = post_adapter(url, "zeta", "beta").json()
    refused = post_adapter(url, "zeta", "gamma")  # vLLM's answer to a name in use
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "adapter_exists"
    assert httpx.get(f"{url}/v1/adapters/zeta").json()["path"] == "beta"
    second = post_adapter(url, "zeta", "gamma", replace=True).json()
    assert second["id"] != first["id"] and second["path"] == "gamma"
    used = complete(url, "zeta").json()["choices"][0]["text"]
    assert used == complete(url, "gamma").json()["choices"][0]["text"]
    assert httpx.delete(f"{url}/v1/adapters/zeta", timeout=60).status_code == 200


@pytest.mark.parametrize(
    "path", ["../outside", "inside/../../outside", "inside/../..", ".", "", "nope"]
)
def test_paths_outside_the_root_or_missing_are_refused(own, path):
    got = post_adapter(own.url, "escapee", path)
    assert got.status_code == 400, got.text
    assert got.json()["error"]["param"] == "path"
    assert httpx.get(f"{own.url}/v1/adapters/escapee").status_code == 404


def test_absolute_path_outside_root_is_refused(own, own_root):
    got = post_adapter(own.url, "escapee", str(own_root.parent / "outside"))
    assert got.status_code == 400 and "outside the adapter root" in got.json()["error"]["message"]


def test_symlink_escape_is_refused_and_inner_symlink_allowed(own, own_root):
    (own_root / "sneaky").symlink_to(own_root.parent / "outside", target_is_directory=True)
    got = post_adapter(own.url, "sneaky", "sneaky")
    assert got.status_code == 400 and got.json()["error"]["param"] == "path"
    (own_root / "alias").symlink_to(own_root / "inside", target_is_directory=True)
    ok = post_adapter(own.url, "alias", "alias")
    assert ok.status_code == 201 and ok.json()["path"] == "inside"
    assert httpx.get(f"{own.url}/v1/adapters").json()["data"][0]["name"] == "alias"


def test_bad_adapter_directories_are_400(own, own_root):
    no_weights = own_root / "no-weights"
    no_weights.mkdir()
    (no_weights / "adapter_config.json").write_text(
        (own_root / "inside/adapter_config.json").read_text()
    )
    pickled = own_root / "pickled"
    pickled.mkdir()
    (pickled / "adapter_config.json").write_text(
        (own_root / "inside/adapter_config.json").read_text()
    )
    (pickled / "adapter_model.bin").write_bytes(b"not really a pickle")
    broken = own_root / "broken-config"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    for name in ("no-weights", "pickled", "broken-config"):
        got = post_adapter(own.url, name, name)
        assert got.status_code == 400, got.text
        error = got.json()["error"]
        assert error["code"] == "invalid_adapter" and error["param"] == "path"
        assert str(own_root) not in error["message"]
        assert httpx.get(f"{own.url}/v1/adapters/{name}").status_code == 404


def test_rank_above_max_lora_rank_is_refused(own, own_root, tiny_hf):
    make_random_adapter(tiny_hf, own_root / "big", rank=16, targets=["q_proj"], seed=1)
    got = post_adapter(own.url, "big", "big")
    assert got.status_code == 400 and "rank" in got.json()["error"]["message"]


@pytest.mark.parametrize("name", ["bad/name", "", "-dash-first", "x" * 200, "tiny-with space"])
def test_bad_names_are_refused(own, name):
    got = post_adapter(own.url, name, "inside")
    assert got.status_code == 400 and got.json()["error"]["param"] == "name"


def test_base_model_name_cannot_be_taken(own):
    base = httpx.get(f"{own.url}/v1/models").json()["data"][0]["id"]
    assert post_adapter(own.url, base, "inside").status_code == 400


def test_vllm_load_and_unload_aliases(own):
    loaded = httpx.post(
        f"{own.url}/v1/load_lora_adapter", json={"lora_name": "viaVLLM", "lora_path": "inside"}
    )
    assert loaded.status_code == 200 and "viaVLLM" in loaded.text
    assert complete(own.url, "viaVLLM").status_code == 200
    unloaded = httpx.post(f"{own.url}/v1/unload_lora_adapter", json={"lora_name": "viaVLLM"})
    assert unloaded.status_code == 200
    assert complete(own.url, "viaVLLM").status_code == 404
    assert (
        httpx.post(f"{own.url}/v1/unload_lora_adapter", json={"lora_name": "viaVLLM"}).status_code
        == 404
    )


def test_delete_lets_running_requests_finish(own):
    assert post_adapter(own.url, "busy", "inside").status_code == 201
    body = {
        "model": "busy",
        "prompt": "Go",
        "max_tokens": 500,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    deleted = {}
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{own.url}/v1/completions", json=body) as stream,
    ):
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data:"))
        assert json.loads(first[5:])["choices"]

        def delete():
            deleted["response"] = httpx.delete(f"{own.url}/v1/adapters/busy", timeout=120)

        worker = threading.Thread(target=delete)
        worker.start()
        # The name disappears at once; the running request is not cut off.
        wait_until(
            lambda: httpx.get(f"{own.url}/v1/adapters/busy").status_code == 404, "name removed"
        )
        assert complete(own.url, "busy").status_code == 404
        assert "response" not in deleted, "DELETE returned while a request still used the adapter"
        rest = sse_payloads(lines)
    worker.join()
    assert rest[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for c in rest if c["choices"][0]["text"]) > 100  # not cut short
    assert deleted["response"].status_code == 200


def test_registration_needs_an_adapter_root(start_server):
    rootless = start_server(gateway={"adapter_root": None})
    got = post_adapter(rootless.url, "x", os.getcwd())
    assert got.status_code == 400 and "--adapter-root" in got.json()["error"]["message"]


def test_a_failing_adapter_load_fails_that_request_only(start_server, tmp_path, tiny_hf):
    """One adapter's files vanish after registration: its requests get 400, others go on."""
    root = tmp_path / "fragile-root"
    for seed, name in enumerate(("fragile", "sturdy")):
        make_random_adapter(tiny_hf, root / name, rank=4, targets=TARGETS, seed=seed)
    # One CPU slot: registering "sturdy" pushes "fragile" out of memory, so it reloads from disk.
    small = start_server(
        gateway={"adapter_root": root, "preload_adapters": False}, max_loras=1, max_cpu_loras=1
    )
    assert post_adapter(small.url, "fragile", "fragile").status_code == 201
    assert post_adapter(small.url, "sturdy", "sturdy").status_code == 201
    (root / "fragile" / "adapter_model.safetensors").unlink()
    failed = complete(small.url, "fragile")
    assert failed.status_code == 400, failed.text
    error = failed.json()["error"]
    assert error["code"] == "invalid_adapter" and error["param"] == "model"
    assert str(root) not in error["message"]
    assert complete(small.url, "sturdy").status_code == 200
    base = httpx.get(f"{small.url}/v1/models").json()["data"][0]["id"]
    assert complete(small.url, base).status_code == 200
    assert httpx.get(f"{small.url}/health").status_code == 200

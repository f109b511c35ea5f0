"""Tenants upload their own adapters over HTTP (issue 37, must-show 1 and 2).

One server on the tiny model with tenancy and a Redis registry (its own namespace), its
adapter store a local directory of this module's own. Uploads are multipart/form-data
with the two files PEFT writes; what a request then generates is compared with PEFT's
greedy output for the very files uploaded. Every refused upload is checked to leave
nothing behind: no object in the store, no staged file, no record, the quota untouched.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import struct
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import torch
from gateway_testlib import TARGETS, wait_until
from safetensors.torch import load_file, save
from servers_testlib import start_tiny_server
from services_testlib import flush_namespace
from tenancy_testlib import ADMIN_KEY, Api
from tiny_llama import make_adapters, peft_greedy, peft_model_with
from uploads_testlib import CONFIG, WEIGHTS, N, generated, parts_of, upload

from loragate.gateway.settings import GatewaySettings


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    """Adapters on disk: `one` to serve, and `crowd0..19` for the concurrent uploads."""
    root = tmp_path_factory.mktemp("uploads")
    specs = {"one": (4, TARGETS, False)}
    specs |= {f"crowd{i}": (2, ["q_proj"], False) for i in range(20)}
    return make_adapters(tiny_dir, root, specs)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("adapter-cache")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("root")


@pytest.fixture(scope="module")
def server(tiny_dir, cache, redis_url, root):
    namespace = f"test-upload-{uuid.uuid4().hex}"
    running = start_tiny_server(
        tiny_dir,
        {},
        adapter_root=root,
        admin_key=ADMIN_KEY,
        redis_url=redis_url,
        redis_namespace=namespace,
        adapter_cache_dir=cache,
    )
    try:
        yield running
    finally:
        running.stop()
        flush_namespace(namespace, redis_url)


@pytest.fixture(scope="module")
def admin(server):
    return Api(server.url, ADMIN_KEY)


def new_tenant(admin: Api, **quota) -> Api:
    return named_tenant(admin, **quota)[1]


def named_tenant(admin: Api, **quota) -> tuple[str, Api]:
    name = f"t{uuid.uuid4().hex[:10]}"
    return name, admin.as_key(admin.create_tenant(name, **quota))


def objects(cache: Path) -> set[str]:
    store = cache / "store"
    return (
        {p.name for p in store.iterdir() if not p.name.startswith(".")} if store.exists() else set()
    )


def leftovers(cache: Path) -> list[str]:
    """Staged uploads or half-written objects still on disk."""
    found = []
    for folder in (cache / "staging", cache / "store"):
        if folder.exists():
            found += [p.name for p in folder.iterdir() if p.name.startswith(".")]
    return found


def test_upload_serves_peft_output_stores_bytes_once_and_names_stay_private(
    admin, cache, files, tiny_dir
):
    acme, globex = new_tenant(admin), new_tenant(admin)
    before = objects(cache)
    got = upload(acme, "mine", parts_of(files["one"]))
    assert got.status_code == 201, got.text
    info = got.json()
    assert (info["name"], info["source"]) == ("mine", "upload") and info["owner"]
    new = objects(cache) - before
    assert len(new) == 1
    (oid,) = new
    assert oid.startswith(info["sha256"] + "-")

    prompt, tokens = generated(acme, "mine")
    reference = peft_model_with(tiny_dir, {"mine": files["one"]})
    assert tokens == peft_greedy(reference, "mine", prompt, N)

    # The same bytes from another tenant: a second name, no second object.
    got = upload(globex, "theirs", parts_of(files["one"]))
    assert got.status_code == 201, got.text
    assert objects(cache) - before == {oid}
    assert generated(globex, "theirs")[1] == tokens
    # Neither sees the other's name, in any route.
    for api, other in ((acme, "theirs"), (globex, "mine")):
        assert api.get(f"/v1/adapters/{other}").status_code == 404
        assert api.complete(other).status_code == 404
        assert other not in {a["name"] for a in api.get("/v1/adapters").json()["data"]}

    # Deleting removes a name; the bytes go with the last name pointing at them.
    assert acme.delete("/v1/adapters/mine").status_code == 200
    assert oid in objects(cache)
    assert generated(globex, "theirs")[1] == tokens
    assert globex.delete("/v1/adapters/theirs").status_code == 200
    assert oid not in objects(cache)
    assert leftovers(cache) == []


def pickled(directory: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(load_file(directory / WEIGHTS), buffer)
    return buffer.getvalue()


def header_bomb() -> bytes:
    return struct.pack("<Q", 10**12) + b'{"a": {"dtype": "F32", "shape": [1], '


def other_model(directory: Path) -> bytes:
    """The same adapter with every lora_A one column wider: another model's hidden size."""
    tensors = load_file(directory / WEIGHTS)
    wider = {k: torch.cat([v, v[:, :1]], dim=1) if "lora_A" in k else v for k, v in tensors.items()}
    return save(wider)


BAD = {
    "pickle": (lambda d: {CONFIG: (d / CONFIG).read_bytes(), WEIGHTS: pickled(d)}, 400, "pickle"),
    "pickle_part": (
        lambda d: {CONFIG: (d / CONFIG).read_bytes(), "adapter_model.bin": pickled(d)},
        400,
        "pickle",
    ),
    "truncated": (
        lambda d: {**parts_of(d), WEIGHTS: (d / WEIGHTS).read_bytes()[:-100]},
        400,
        "safetensors",
    ),
    "header_bomb": (lambda d: {**parts_of(d), WEIGHTS: header_bomb()}, 400, "header"),
    "other_model": (lambda d: {**parts_of(d), WEIGHTS: other_model(d)}, 400, "d_in"),
    "missing_config": (lambda d: {WEIGHTS: (d / WEIGHTS).read_bytes()}, 400, CONFIG),
    "not_lora_config": (
        lambda d: {**parts_of(d), CONFIG: json.dumps({"peft_type": "IA3"}).encode()},
        400,
        "IA3",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_uploads_are_refused_naming_the_problem_and_leave_nothing(admin, cache, files, case):
    tenant = new_tenant(admin, max_adapters=1)
    make, status, words = BAD[case]
    before = objects(cache)
    got = upload(tenant, "bad", make(files["one"]))
    assert got.status_code == status, got.text
    assert words.lower() in got.json()["error"]["message"].lower(), got.text
    assert objects(cache) == before and leftovers(cache) == []
    assert tenant.get("/v1/adapters").json()["data"] == []
    # The quota is untouched: the one adapter it allows still lands.
    assert upload(tenant, "good", parts_of(files["crowd0"])).status_code == 201
    assert tenant.delete("/v1/adapters/good").status_code == 200


def raw_post(url: str, key: str, head: dict[str, str], body_chunks, close_early=False):
    """POST /v1/adapters over a plain socket: (bytes the server let us send, its answer)."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    lines = ["POST /v1/adapters HTTP/1.1", f"Host: {parts.netloc}", f"Authorization: Bearer {key}"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    sent = 0
    try:
        try:
            for chunk in body_chunks:
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the server closed the connection: read what it answered
        if close_early:
            return sent, b""
        return sent, read_answer(sock)
    finally:
        sock.close()


def read_answer(sock) -> bytes:
    """One HTTP response (headers and a Content-Length body), or what came before a reset."""
    answer = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                length = [
                    int(line.split(b":")[1])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                ]
                if length and len(body) >= length[0]:
                    return answer
    except OSError:
        return answer


def multipart_head(boundary: str, name: str) -> bytes:
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="{WEIGHTS}"; '
        f'filename="{WEIGHTS}"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()


def test_an_upload_over_the_limit_is_refused_and_the_server_stops_reading(admin, server, cache):
    tenant = new_tenant(admin)
    limit = 64 << 20  # far more than any buffer between us and the server holds
    boundary = "b" + uuid.uuid4().hex
    announced = 1 << 40
    # An honest Content-Length over the limit: refused before a byte of the body is read.
    sent, answer = raw_post(
        server.url,
        tenant.key,
        {
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Content-Length": str(announced),
        },
        [multipart_head(boundary, "huge")],
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"adapter_too_large" in answer

    # A chunked body that never ends: reading stops at the limit, the connection closes.
    def endless():
        yield b"%x\r\n%s\r\n" % (len(head := multipart_head(boundary, "huge")), head)
        block = b"\0" * (1 << 20)
        for _ in range(limit >> 20):
            yield b"%x\r\n%s\r\n" % (len(block), block)

    sent, answer = raw_post(
        server.url,
        tenant.key,
        {
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Transfer-Encoding": "chunked",
        },
        endless(),
    )
    assert sent < limit // 2, f"the server read {sent} bytes"
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:200]
    wait_until(lambda: leftovers(cache) == [], "the staged upload removed", 10)
    assert tenant.get("/v1/adapters").json()["data"] == []


def test_a_body_that_stops_halfway_leaves_nothing(admin, server, cache, files):
    tenant = new_tenant(admin)
    boundary = "b" + uuid.uuid4().hex
    weights = (files["one"] / WEIGHTS).read_bytes()
    body = multipart_head(boundary, "half") + weights
    whole = len(body) + 64
    head = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    # The client goes away mid-body.
    raw_post(
        server.url,
        tenant.key,
        {**head, "Content-Length": str(whole)},
        [body[: len(body) // 2]],
        close_early=True,
    )
    # The body ends (as its length said) without the closing boundary.
    _, answer = raw_post(server.url, tenant.key, {**head, "Content-Length": str(len(body))}, [body])
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert b"incomplete" in answer or b"malformed" in answer
    before = objects(cache)
    wait_until(lambda: leftovers(cache) == [], "the staged uploads removed", 10)
    assert objects(cache) == before
    assert tenant.get("/v1/adapters").json()["data"] == []


def test_twenty_concurrent_uploads_against_max_adapters_five(admin, cache, files):
    tenant = new_tenant(admin, max_adapters=5)
    before = objects(cache)
    answers: list[httpx.Response] = []
    start = threading.Barrier(20)

    def send(i: int) -> None:
        start.wait()
        answers.append(upload(tenant, f"crowd{i}", parts_of(files[f"crowd{i}"])))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] * 5 + [429] * 15, [a.text for a in answers if a.status_code >= 500]
    assert all(a.json()["error"]["code"] == "max_adapters" for a in answers if a.status_code == 429)
    listed = tenant.get("/v1/adapters").json()["data"]
    assert len(listed) == 5
    assert len(objects(cache) - before) == 5, "refused uploads left objects behind"
    assert leftovers(cache) == []
    for adapter in listed:
        assert tenant.complete(adapter["name"]).status_code == 200
        assert tenant.delete(f"/v1/adapters/{adapter['name']}").status_code == 200
    assert objects(cache) == before


def test_max_adapter_bytes_holds_and_counts_each_name(admin, cache, files):
    size = len((files["crowd1"] / WEIGHTS).read_bytes())
    tenant = new_tenant(admin, max_adapter_bytes=2 * size)
    for name in ("a", "b"):
        assert upload(tenant, name, parts_of(files["crowd1"])).status_code == 201
    got = upload(tenant, "c", parts_of(files["crowd2"]))
    assert got.status_code == 429 and got.json()["error"]["code"] == "max_adapter_bytes", got.text
    # Replacing one of its own adapters is allowed: the old one's bytes no longer count.
    got = upload(tenant, "a", parts_of(files["crowd2"]), replace=True)
    assert got.status_code == 201, got.text
    for name in ("a", "b"):
        assert tenant.delete(f"/v1/adapters/{name}").status_code == 200


def test_a_file_source_only_from_the_callers_folder(admin, root, cache, files):
    name, tenant = named_tenant(admin)
    other, _ = named_tenant(admin)
    for owner in (name, other):
        shutil.copytree(files["crowd3"], root / owner / "x")
    before = objects(cache)
    got = tenant.post("/v1/adapters", {"name": "x", "source": f"file://{root / name / 'x'}"})
    assert got.status_code == 201, got.text
    assert got.json()["source"] == "source" and len(objects(cache) - before) == 1
    assert tenant.complete("x").status_code == 200
    outside = tenant.post("/v1/adapters", {"name": "y", "source": f"file://{root / other / 'x'}"})
    assert outside.status_code == 400, outside.text
    assert "outside the adapter root" in outside.json()["error"]["message"]
    both = tenant.post("/v1/adapters", {"name": "z", "path": "x", "source": "file:///x"})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    assert tenant.delete("/v1/adapters/x").status_code == 200
    assert objects(cache) == before


@pytest.mark.parametrize(
    "bad",
    [
        {"max_adapter_bytes": 0},
        {"max_adapter_bytes": "big"},
        {"adapter_store": "s3://"},
        {"adapter_store": "gs://bucket/x"},
        {"adapter_store": ""},
    ],
)
def test_store_settings_are_checked(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        GatewaySettings(**bad)


def test_replacing_or_deleting_the_tenant_frees_the_bytes(admin, cache, files):
    name, tenant = named_tenant(admin)
    before = objects(cache)
    assert upload(tenant, "x", parts_of(files["crowd4"])).status_code == 201
    (first,) = objects(cache) - before
    got = upload(tenant, "x", parts_of(files["crowd5"]), replace=True)
    assert got.status_code == 201, got.text
    wait_until(lambda: first not in objects(cache), "the replaced object deleted", 10)
    (second,) = objects(cache) - before
    assert tenant.complete("x").status_code == 200
    assert admin.delete(f"/v1/tenants/{name}").status_code == 200
    wait_until(lambda: second not in objects(cache), "the deleted tenant's object deleted", 10)
    assert objects(cache) == before

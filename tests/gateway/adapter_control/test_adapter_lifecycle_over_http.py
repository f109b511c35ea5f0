"""One adapter's whole life over HTTP and through the adapter store, every count checked at
each stage (issue 44, must-show 2; tests/engine/test_adapter_lifecycle.py walks the same
life inside the engine).

A server on the tiny model with one device slot and two CPU places, its adapter store a
directory of this test's own. Adapter `a` is uploaded (its bytes stored once under their
hash, read into the CPU tier), asked for (while its request runs: one request in flight for
`a` and one hold, both counted by the engine's adapter residency, which owns them), evicted
from its slot by `b`, evicted from the CPU tier by `c`, asked for again (read back from the
store by hash), replaced by other files (a new object; the old one deleted once nothing
names it; requests get the new weights), and deleted while a request runs on it (its name
is gone at once, the delete waits for the request, which finishes on its weights). At the
end every count is zero and the store is empty. Outputs equal PEFT's for the files served.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from gateway_testlib import TARGETS, wait_until
from servers_testlib import start_tiny_server
from tenancy_testlib import Api
from tiny_llama import make_adapters, peft_greedy, peft_model_with
from uploads_testlib import N, generated, parts_of, upload

WAIT_S = 60


class Pause:
    """The server's engine thread stops after the next step that runs a request, until
    `resume` is set, so the test reads the counts while the request runs."""

    def __init__(self, llm_engine):
        self.engine = llm_engine
        self._step_tokens = llm_engine.step_tokens
        llm_engine.step_tokens = self.step_tokens
        self.armed = False
        self.paused = threading.Event()
        self.resume = threading.Event()

    def arm(self) -> None:
        self.paused.clear()
        self.resume.clear()
        self.armed = True

    def step_tokens(self):
        step = self._step_tokens()
        if self.armed and self.engine.requests:
            self.armed = False
            self.paused.set()
            self.resume.wait(WAIT_S)
        return step


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_dir):
    root = tmp_path_factory.mktemp("lifecycle-files")
    specs = {name: (4, TARGETS, False) for name in ("a", "b", "c", "a2")}
    return make_adapters(tiny_dir, root, specs)


@pytest.fixture
def server(tiny_dir, tmp_path):
    running = start_tiny_server(
        tiny_dir,
        {"max_loras": 1, "max_cpu_loras": 2},
        adapter_cache_dir=tmp_path / "cache",
        adapter_store=str(tmp_path / "store"),
        preload_adapters=False,
    )
    try:
        yield running
    finally:
        running.stop()


def objects(store: Path) -> set[str]:
    if not store.exists():
        return set()
    return {p.name for p in store.iterdir() if not p.name.startswith(".")}


def test_an_adapter_from_upload_to_deletion_over_http(server, files, tiny_dir, tmp_path):
    api = Api(server.url)
    store = tmp_path / "store"
    async_engine = server.app.state.services.engine
    llm_engine = async_engine.engine
    residency = llm_engine.residency
    pause = Pause(llm_engine)
    peft = peft_model_with(tiny_dir, files)

    def counts() -> dict:
        stats = residency.counts()
        return {
            "slots": int(stats["resident_adapters"]),
            "cpu": int(stats["cpu_adapters"]),
            "holds": int(stats["held_weights"]),
            "in_flight": residency.in_flight_by_name(),
            "requests": len(llm_engine.requests),
        }

    def idle(slots: int, cpu: int) -> dict:
        return {"slots": slots, "cpu": cpu, "holds": 0, "in_flight": {}, "requests": 0}

    def served(name: str, files_of: str) -> None:
        """A request for `name`, checked against PEFT for the files `files_of`."""
        ids, tokens = generated(api, name)
        assert tokens == peft_greedy(peft, files_of, ids, N), f"{name} served other weights"

    def while_running(name: str, files_of: str, check) -> None:
        """A request for `name` runs; `check()` while the engine thread waits after its
        first step; then it finishes on `files_of`'s weights."""
        pause.arm()
        done: list = []
        request = threading.Thread(target=lambda: done.append(generated(api, name)))
        request.start()
        try:
            assert pause.paused.wait(WAIT_S), "the request never ran"
            check()
        finally:
            pause.resume.set()
            request.join(WAIT_S)
        ((ids, tokens),) = done
        assert tokens == peft_greedy(peft, files_of, ids, N)

    # Registered: uploaded, stored once under its hash, read into the CPU tier.
    got = upload(api, "a", parts_of(files["a"]))
    assert got.status_code == 201, got.text
    (first_object,) = objects(store)
    assert first_object.startswith(got.json()["sha256"] + "-")
    assert counts() == idle(slots=0, cpu=1)

    # First request: while it runs, one request in flight for `a` and one hold.
    def running_a() -> None:
        assert counts() == {
            "slots": 1,
            "cpu": 1,
            "holds": 1,
            "in_flight": {"a": 1},
            "requests": 1,
        }

    while_running("a", "a", running_a)
    assert counts() == idle(slots=1, cpu=1)

    # Evicted from its slot: `b` takes the one slot; `a` stays in the CPU tier.
    assert upload(api, "b", parts_of(files["b"])).status_code == 201
    served("b", "b")
    assert residency.counts()["device_evictions"] == 1
    assert counts() == idle(slots=1, cpu=2)

    # Evicted from the CPU tier: `c` comes in and `a`, used least recently, leaves memory.
    assert upload(api, "c", parts_of(files["c"])).status_code == 201
    assert residency.counts()["cpu_evictions"] == 1
    assert counts() == idle(slots=1, cpu=2)
    # Asked for again: read back from its store object by hash.
    reads = residency.counts()["file_reads"]
    served("a", "a")
    assert residency.counts()["file_reads"] == reads + 1
    assert counts() == idle(slots=1, cpu=2)

    # Files changed: `a` now names other bytes (a new object); the old object goes once
    # nothing names it, and requests get the new weights.
    got = upload(api, "a", parts_of(files["a2"]), replace=True)
    assert got.status_code == 201, got.text
    wait_until(lambda: first_object not in objects(store), "the old object deleted")
    assert len(objects(store)) == 3
    served("a", "a2")
    assert counts()["in_flight"] == {} and counts()["holds"] == 0

    # Deleted while a request runs: the name is gone at once, the delete waits for the
    # request, which finishes on its own weights; then nothing of `a` is counted or stored.
    deleted: list = []
    deleter = threading.Thread(target=lambda: deleted.append(api.delete("/v1/adapters/a")))

    def delete_while_running() -> None:
        deleter.start()
        wait_until(lambda: api.get("/v1/adapters/a").status_code == 404, "the name gone")
        assert api.complete("a").status_code == 404
        assert not deleted, "the delete returned while a request still ran on the adapter"
        assert counts()["in_flight"] == {"a": 1} and counts()["holds"] == 1

    while_running("a", "a2", delete_while_running)
    deleter.join(WAIT_S)
    assert deleted[0].status_code == 200, deleted[0].text
    wait_until(lambda: len(objects(store)) == 2, "the object of `a` deleted")
    assert counts()["in_flight"] == {} and counts()["holds"] == 0

    # Every other adapter deleted: every count is zero, the store empty.
    for name in ("b", "c"):
        assert api.delete(f"/v1/adapters/{name}").status_code == 200
    wait_until(lambda: not objects(store), "the store emptied")
    assert counts() == idle(slots=0, cpu=0)
    assert residency.tiers() == {}

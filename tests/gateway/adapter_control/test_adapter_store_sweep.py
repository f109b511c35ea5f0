"""The sweep of a deployment's adapter store (gateway/adapter_control/adapter_store_objects.py):
objects that no registration names and no upload pins are deleted; referenced and pinned ones
stay. The engine hears of each deletion, and is asked to prune its cache, through its
EngineClient alone (issue 58)."""

from __future__ import annotations

from pathlib import Path

from loragate.adapters.store import LocalStore
from loragate.gateway.adapter_control.adapter_store_objects import AdapterObjects
from loragate.gateway.registry_seam import RegistrySeam
from loragate.registry import AdapterSpec
from loragate.registry.memory import MemoryRegistryStore

IDS = {name: c * 64 + "-" + c * 64 for name, c in (("named", "a"), ("pinned", "b"), ("lost", "c"))}


class StoreTold:
    """The adapter store members of an EngineClient, noting what the gateway tells it."""

    def __init__(self):
        self.told: list[tuple] = []

    async def adopt_adapter_object(self, oid: str, directory: Path) -> None:
        self.told.append(("adopt", oid))

    async def forget_adapter_object(self, oid: str) -> None:
        self.told.append(("forget", oid))

    async def prune_adapter_objects(self) -> list[str]:
        self.told.append(("prune",))
        return []


def put(store: LocalStore, oid: str) -> None:
    folder = store.root / f"{oid}"
    folder.mkdir(parents=True)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (folder / name).write_bytes(b"x")


async def test_the_sweep_deletes_only_what_nothing_uses(tmp_path: Path):
    registry = RegistrySeam(MemoryRegistryStore())
    store = LocalStore(tmp_path / "store")
    for oid in IDS.values():
        put(store, oid)
    named = AdapterSpec(
        name="a",
        base_model="tiny",
        rank=4,
        alpha=8,
        target_modules=("q_proj",),
        sha256="a" * 64,
        size_bytes=1,
        path="upload",
        store_object=IDS["named"],
    )
    await registry.register_adapter(named)
    await registry.pin_object(IDS["pinned"])
    engine = StoreTold()
    objects = AdapterObjects(registry, store, engine, tmp_path / "s")
    assert await objects.sweep() == 1
    assert store.list() == sorted([IDS["named"], IDS["pinned"]])
    assert engine.told == [("forget", IDS["lost"]), ("prune",)]
    assert await objects.sweep() == 0
    assert engine.told[2:] == [("prune",)]

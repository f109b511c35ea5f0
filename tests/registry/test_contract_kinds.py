"""An adapter's kind (issue 45: "lora", "dora", "lora+saved-modules"...) on its record, in
every store: registered, read back by another replica, changed with the files' other
weights, and "lora" for a record written before records had kinds."""

from __future__ import annotations

import msgspec
import pytest
from registry_testlib import spec

from loragate.registry import AdapterMetadata, AdapterWeights


async def test_a_registration_keeps_its_kind_and_files_changed_in_place_change_it(store, peer):
    adapter = (await store.register_adapter(spec("sql", kind="dora"))).adapter
    assert adapter.kind == "dora"
    assert (await peer.get_adapter("sql")).kind == "dora"
    weights = AdapterWeights(
        rank=4,
        alpha=8.0,
        target_modules=("q_proj",),
        sha256="cd" * 32,
        size_bytes=25_000_000,
        kind="lora+saved-modules",
    )
    updated = await peer.update_adapter("sql", lora_int_id=adapter.lora_int_id, weights=weights)
    assert (updated.kind, updated.size_bytes) == ("lora+saved-modules", 25_000_000)
    assert (await store.get_adapter("sql")).kind == "lora+saved-modules"
    assert (await store.register_adapter(spec("plain"))).adapter.kind == "lora"


def test_a_record_from_before_kinds_reads_as_lora_and_an_unknown_kind_is_refused():
    record = msgspec.to_builtins(
        AdapterMetadata(**msgspec.structs.asdict(spec("old")), lora_int_id=3, created_at=1.0)
    )
    del record["kind"]
    assert msgspec.json.decode(msgspec.json.encode(record), type=AdapterMetadata).kind == "lora"
    for kind in ("dora+vocab-lora", "lora+saved-modules+trainable-tokens", "lora+bias"):
        assert spec("ok", kind=kind).kind == kind
    for bad in ("", "qlora", "lora+", "DoRA", 3):
        with pytest.raises(ValueError, match="kind"):
            spec("bad", kind=bad)

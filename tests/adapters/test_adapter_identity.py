"""The weights' identity (issue 21): a content hash, trusted again from a stat only while the
files provably did not change, and used as the key of both cache tiers."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from stamp_clock_testlib import AheadClock
from tiers_testlib import in_slots

from loragate.adapters import AdapterChangedError, LoRARequest
from loragate.adapters import identity as identity_module
from loragate.adapters.identity import CONFIG_FILE, WEIGHTS_FILE, IdentityBook, stamp_files
from loragate.engine.lora.adapter_residency import AdapterResidency

RACY_NS = 50_000_000  # a short racy window keeps these tests quick


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch):
    monkeypatch.setattr(identity_module, "RACY_NS", RACY_NS)


def settle():
    time.sleep(RACY_NS / 1e9 + 0.02)


def copy_files(source, directory):
    """Overwrite ``directory``'s files in place (same inodes) with ``source``'s."""
    directory.mkdir(exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        with open(directory / name, "wb") as f:
            f.write((source / name).read_bytes())


@pytest.fixture
def two(make_adapter):
    """Adapters A and B with the same rank and targets: files of the same sizes."""
    return make_adapter("A", rank=4, seed=1), make_adapter("B", rank=4, seed=2)


def cache_for(spec, **kw):
    kw = {"max_loras": 1, "max_lora_rank": 8, "max_cpu_loras": 2, **kw}
    return AdapterResidency(spec, **kw)


def test_unchanged_files_are_vouched_for_by_a_stat(spec, two, tmp_path):
    a, _ = two
    residency = cache_for(spec)
    request = LoRARequest("a", 1, str(a))
    first = residency.preload(request).identity
    settle()
    residency.preload(request)  # the first stamp was racy: hashed once more, then trusted
    reads = residency.counts()["file_reads"]
    for _ in range(20):
        assert residency.preload(request).identity == first
        assert residency.acquire_slot(request, set(), first) == 0
    assert residency.counts()["file_reads"] == reads


@pytest.mark.parametrize("how", ["in place", "renamed into place"])
def test_changed_files_are_a_new_identity(spec, two, tmp_path, how, caplog):
    a, b = two
    live = tmp_path / "live"
    copy_files(a, live)
    residency = cache_for(spec)
    request = LoRARequest("live", 1, str(live))
    old = residency.preload(request).identity
    settle()
    if how == "in place":
        copy_files(b, live)
    else:
        staged = tmp_path / "staged"
        shutil.copytree(b, staged)
        shutil.rmtree(live)
        os.rename(staged, live)
    new = residency.preload(request).identity
    assert new != old and new.sha256 == residency.preload(LoRARequest("b", 2, str(b))).sha256
    assert sum("changed" in r.message for r in caplog.records) == 1  # logged once
    residency.preload(request)
    assert sum("changed" in r.message for r in caplog.records) == 1


def test_a_stamp_is_trusted_only_once_older_than_the_racy_window(two, tmp_path):
    """A same-size write in the clock tick of the stat would leave every field as it was, so a
    stamp taken right after a write is not trusted (the caller re-hashes). An older one is;
    a same-size write in place is then seen even with the old mtime put back (ctime moves)."""
    a, b = two
    live = tmp_path / "live"
    copy_files(a, live)
    book, identity = IdentityBook(), identity_module.WeightsIdentity("a" * 64, "c" * 64)
    racy = stamp_files(live)
    assert not racy.trusted
    book.record(str(live), racy, identity, "live")
    assert book.known(str(live)) is None
    settle()
    book.record(str(live), stamp_files(live), identity, "live")
    assert book.known(str(live)) == identity
    mtime = (live / WEIGHTS_FILE).stat().st_mtime_ns
    copy_files(b, live)
    os.utime(live / WEIGHTS_FILE, ns=(mtime, mtime))
    os.utime(live / CONFIG_FILE, ns=(mtime, mtime))
    assert book.known(str(live)) is None


def test_one_int_id_with_two_weight_sets_is_two_entries(spec, two, tmp_path):
    a, b = two
    live = tmp_path / "live"
    copy_files(a, live)
    residency = cache_for(spec, max_loras=2, max_cpu_loras=2)
    request = LoRARequest("x", 3, str(live))
    old = residency.preload(request).identity
    old_slot = residency.acquire_slot(request, set(), old)
    copy_files(b, live)
    new = residency.preload(request).identity
    new_slot = residency.acquire_slot(request, set(), new)
    assert new != old and new_slot != old_slot
    assert in_slots(residency) == {old.sha256, new.sha256}
    assert (
        residency.acquire_slot(request, set(), old) == old_slot
    )  # each weight set keeps its own slot


def test_admitted_weights_stay_in_memory_until_released(spec, two, make_adapter, tmp_path):
    """Weights an admitted request needs and no file holds any more stay in the CPU tier
    (another adapter read beside them, where they fill it, is validated but not kept); once
    released they age out. Without a hold, a request whose weights left memory gets
    AdapterChangedError, never other weights."""
    a, b = two
    live = tmp_path / "live"
    copy_files(a, live)
    residency = cache_for(spec, max_loras=1, max_cpu_loras=1)
    request = LoRARequest("live", 1, str(live))
    admitted = residency.preload(request).identity
    residency.hold_weights(admitted)
    copy_files(b, live)
    other = LoRARequest("c", 2, str(make_adapter("C", seed=3)))
    residency.preload(other)  # A is needed, gone from disk, and fills the tier: C is not kept
    assert residency.counts()["cpu_adapters"] == 1 and residency.in_memory(admitted)
    assert residency.acquire_slot(request, set(), admitted) is not None
    assert in_slots(residency) == {admitted.sha256}
    residency.release_weights(admitted)
    residency.acquire_slot(other, set())  # the slot moves on; A may now leave the CPU tier
    residency.preload(LoRARequest("d", 4, str(make_adapter("D", seed=4))))
    assert [r.lora_name for r in residency.cpu_resident()] == ["d"]
    with pytest.raises(AdapterChangedError, match="changed after this request was admitted"):
        residency.acquire_slot(request, set(), admitted)


def test_a_store_check_vouches_without_standing_for_a_read(two, tmp_path, caplog):
    """What a store's check hashed (``vouch``) is an entry a read may take the word of, not
    a read: no stat admits the files on it, no slot is looked up by it, and a read that
    hashes other weights is no change to warn of. A read records over it; ``forget`` drops
    either."""
    a, _ = two
    live = tmp_path / "live"
    copy_files(a, live)
    clock = AheadClock()
    clock.settle()
    book, stamp = IdentityBook(clock), stamp_files(live, clock)
    checked = identity_module.WeightsIdentity("a" * 64, "c" * 64)
    read = identity_module.WeightsIdentity("b" * 64, "c" * 64)
    book.vouch(str(live), stamp, checked)
    assert stamp.trusted and book.entry(str(live)) == (stamp, checked)
    assert book.known(str(live)) is None and book.last(str(live)) is None
    book.record(str(live), stamp, read, "live")
    assert not [r for r in caplog.records if "changed" in r.message]
    assert book.known(str(live)) == read == book.last(str(live))
    book.forget(str(live))
    assert book.entry(str(live)) is None and book.known(str(live)) is None

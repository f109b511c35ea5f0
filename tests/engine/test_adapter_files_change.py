"""An adapter is its weights (issue 21): files changed in place never serve stale weights or KV.

Every case runs a long shared prompt (542 tokens, 33 full KV blocks) with prefix caching on,
greedy, float32, and compares with PEFT for the weights on disk when the request was made.
Adapters A and B have the same rank and targets, so their files have the same sizes: only
the content, mtime and ctime tell them apart.
"""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch
from files_change_testlib import engine, put
from stamp_clock_testlib import AheadClock
from tiers_testlib import in_slots, weights_sha256
from tiny_llama import ALL_MODULES, make_adapters, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest
from loragate.adapters import loader as loader_module
from loragate.adapters.identity import WEIGHTS_FILE
from loragate.engine import SamplingParams

PROMPT = [
    1,
    *torch.randint(100, 20000, (541,), generator=torch.Generator().manual_seed(21)).tolist(),
]
N = 12
PARAMS = SamplingParams(temperature=0, max_tokens=N, min_tokens=N)
SPECS = {  # same rank and targets: same file sizes
    "A": (8, ALL_MODULES, False),
    "B": (8, ALL_MODULES, False),
    "C": (4, ["q_proj", "v_proj"], False),
    "D": (4, ["o_proj", "down_proj"], False),
}


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("weights"), SPECS)
    peft_model = peft_model_with(model_dir, paths)
    expected = {name: peft_greedy(peft_model, name, PROMPT, N) for name in SPECS}
    expected[None] = peft_greedy(peft_model, None, PROMPT, N)
    assert len({tuple(expected[k]) for k in ("A", "B", None)}) == 3, "A, B, base must differ"
    return model_dir, paths, expected


def run(llm, lora):
    out = llm.generate({"prompt_token_ids": PROMPT}, PARAMS, lora_request=lora, use_tqdm=False)
    return out[0].outputs[0].token_ids


def test_files_overwritten_in_place_serve_the_new_weights(setup, make_llm, tmp_path):
    """Issue cases 1 and 2: id 3 served A, files become B -> B; files back to A, id 4 -> A."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir)
    x = tmp_path / "x"
    put(paths, "A", x)
    assert run(llm, LoRARequest("x", 3, str(x))) == expected["A"]
    put(paths, "B", x)
    out = llm.generate(
        {"prompt_token_ids": PROMPT}, PARAMS, lora_request=LoRARequest("x", 3, str(x))
    )[0]
    assert out.outputs[0].token_ids == expected["B"]
    assert out.lora_sha256 == _weights_sha(paths, "B")
    # One int id, two weight sets: two entries in the CPU tier, never one overwritten.
    assert llm.engine.residency.counts()["cpu_adapters"] == 2
    put(paths, "A", x)
    assert run(llm, LoRARequest("x", 4, str(x))) == expected["A"]
    assert run(llm, LoRARequest("x", 3, str(x))) == expected["A"]


def test_old_weights_left_in_a_slot_after_the_cpu_tier_dropped_them(setup, make_llm, tmp_path):
    """Issue cases 3 and 4: y's A still sits in a device slot, the CPU tier has dropped it, the
    files now hold B: the request runs B. Once y's slot is gone, the cached prompt KV (computed
    with B) is reused and still gives B, as with prefix caching off."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir, max_loras=2, max_cpu_loras=2)
    residency = llm.engine.residency
    y = tmp_path / "y"
    put(paths, "A", y)
    lora_y = LoRARequest("y", 3, str(y))
    assert run(llm, lora_y) == expected["A"]
    a_identity = residency.preload(lora_y).identity
    # Registering two other adapters (the gateway preloads them) pushes A out of the CPU tier.
    for name in ("C", "D"):
        residency.preload(LoRARequest(name, 10 + len(name), str(paths[name])))
    assert a_identity.sha256 in in_slots(residency)
    assert "y" not in [r.lora_name for r in residency.cpu_resident()]
    put(paths, "B", y)
    assert run(llm, lora_y) == expected["B"]
    # Case 4: y's weights leave the device; the prompt's cached KV is reused.
    for name in ("C", "D"):
        assert run(llm, LoRARequest(name, 10 + len(name), str(paths[name]))) == expected[name]
    assert {a_identity.sha256, weights_sha256(y)}.isdisjoint(in_slots(residency))
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora_y) == expected["B"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] - hits >= 512, "KV not reused"
    uncached = engine(make_llm, model_dir, prefix_caching=False)
    assert run(uncached, lora_y) == expected["B"]


def test_prefix_cache_never_returns_kv_computed_under_other_weights(setup, make_llm, tmp_path):
    """The prompt's KV computed with A is never reused for the same name and id once the
    files hold B (no hit at all), and the answer equals caching off and PEFT's B."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir)
    x = tmp_path / "x"
    put(paths, "A", x)
    lora = LoRARequest("x", 3, str(x))
    assert run(llm, lora) == expected["A"]
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora) == expected["A"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] - hits >= 512  # A's KV reused
    put(paths, "B", x)
    hits = llm.get_memory_stats()["prefix_cache_hit_tokens"]
    assert run(llm, lora) == expected["B"]
    assert llm.get_memory_stats()["prefix_cache_hit_tokens"] == hits, "A's KV served for B"
    assert run(engine(make_llm, model_dir, prefix_caching=False), lora) == expected["B"]


def test_a_waiting_request_runs_with_the_weights_it_was_admitted_under(setup, make_llm, tmp_path):
    """Admitted under A, then the files become B and the CPU tier fills up before it is
    scheduled: it still runs with A (the CPU tier keeps A past its bound while it is needed);
    the next request gets B, and A then ages out."""
    model_dir, paths, expected = setup
    llm = engine(make_llm, model_dir, max_loras=1, max_cpu_loras=1)
    x = tmp_path / "x"
    put(paths, "A", x)
    lora = LoRARequest("x", 3, str(x))
    request = llm.engine.add_request("early", {"prompt_token_ids": PROMPT}, PARAMS, lora)
    put(paths, "B", x)
    llm.engine.residency.preload(LoRARequest("c", 9, str(paths["C"])))  # would evict A
    outputs = []
    while llm.engine.has_unfinished_requests():
        outputs += [o for o in llm.engine.step() if o.finished]
    assert outputs[0].outputs[0].token_ids == expected["A"]
    assert request.adapter_identity.sha256 == _weights_sha(paths, "A")
    assert run(llm, lora) == expected["B"]
    stats = llm.engine.residency.counts()
    assert stats["cpu_adapters"] == 1 and stats["held_weights"] == 0  # A aged out once unneeded


def test_unchanged_files_are_not_rehashed_over_100_requests(setup, make_llm, monkeypatch):
    model_dir, paths, expected = setup
    clock = AheadClock()
    llm = engine(make_llm, model_dir, stamp_clock=clock)
    lora = LoRARequest("a", 1, str(paths["A"]))
    hashes = []
    real = loader_module.hashed_read

    def counted(path, pacing, hash_it=True, lease=None):
        hashes.extend([1] if hash_it else [])
        return real(path, pacing, hash_it, lease)

    monkeypatch.setattr(loader_module, "hashed_read", counted)
    assert run(llm, lora) == expected["A"]
    # A stamp taken within RACY_NS of the files' last write is not trusted (a write in the same
    # clock tick could hide): the engine's stamp clock moves past it.
    clock.settle()
    assert run(llm, lora) == expected["A"]
    before, reads = len(hashes), llm.engine.residency.counts()["file_reads"]
    short = SamplingParams(temperature=0, max_tokens=1)
    outs = llm.generate(
        [{"prompt_token_ids": [1, 5, 6, i]} for i in range(100)],
        short,
        lora_request=lora,
        use_tqdm=False,
    )
    assert len(outs) == 100
    assert len(hashes) == before, "unchanged files were hashed again"
    assert llm.engine.residency.counts()["file_reads"] == reads


def _weights_sha(paths, name) -> str:
    return hashlib.sha256((paths[name] / WEIGHTS_FILE).read_bytes()).hexdigest()


def test_finished_and_aborted_requests_release_their_weights(setup, make_llm):
    model_dir, paths, _ = setup
    llm = engine(make_llm, model_dir)
    lora = LoRARequest("a", 1, str(paths["A"]))
    for request_id in ("kept", "aborted"):
        llm.engine.add_request(request_id, {"prompt_token_ids": PROMPT}, PARAMS, lora)
    assert llm.engine.residency.counts()["held_weights"] == 1
    llm.engine.step()
    assert llm.engine.abort_request("aborted")
    assert llm.engine.residency.counts()["held_weights"] == 1
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert llm.engine.residency.counts()["held_weights"] == 0


def _reads_by_thread(monkeypatch) -> list[str]:
    """The thread of every adapter file read from now on."""
    from loragate.adapters import cpu_tier

    threads: list[str] = []
    real = cpu_tier.load_adapter

    def load(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_tier, "load_adapter", load)
    return threads


def _drain(llm) -> dict:
    outputs = {}
    while llm.engine.has_unfinished_requests():
        outputs.update((o.request_id, o) for o in llm.engine.step() if o.finished)
    return outputs


def test_weights_that_left_memory_come_back_on_a_loader_thread(
    setup, make_llm, tmp_path, monkeypatch
):
    """A was read, then left the CPU tier; a request for it is admitted under A by a stat (no
    read) and, once the tier has room beside the weights running requests hold, a loader
    thread reads A back (never the step) while a base request runs; the answer is A's."""
    model_dir, paths, expected = setup
    clock = AheadClock()
    llm = engine(make_llm, model_dir, max_loras=1, max_cpu_loras=1, stamp_clock=clock)
    x = tmp_path / "x"
    put(paths, "A", x)
    clock.settle()  # a stat vouches for A's files from now on
    llm.engine.residency.preload(LoRARequest("x", 3, str(x)))
    c = LoRARequest("c", 9, str(paths["C"]))
    llm.engine.add_request("c", {"prompt_token_ids": PROMPT}, PARAMS, c)  # C evicts A
    threads = _reads_by_thread(monkeypatch)
    llm.engine.add_request("a", {"prompt_token_ids": PROMPT}, PARAMS, LoRARequest("x", 3, str(x)))
    assert not llm.engine.residency.loading, "C's request holds the one place in the tier"
    llm.engine.add_request("base", {"prompt_token_ids": PROMPT}, PARAMS)
    outputs = _drain(llm)
    assert outputs["a"].outputs[0].token_ids == expected["A"]
    assert outputs["c"].outputs[0].token_ids == expected["C"]
    assert outputs["base"].outputs[0].token_ids == expected[None]
    assert threads and all(t.startswith("loragate-adapter-load") for t in threads), threads


def test_a_load_that_fails_fails_only_its_request(setup, make_llm, tmp_path, monkeypatch):
    """Admitted under A (by a stat: A had left memory), its load waiting for room while C's
    request runs; the files then hold B: the loader's AdapterChangedError fails that request
    alone; the others finish."""
    model_dir, paths, expected = setup
    clock = AheadClock()
    llm = engine(make_llm, model_dir, max_loras=1, max_cpu_loras=1, stamp_clock=clock)
    x = tmp_path / "x"
    put(paths, "A", x)
    clock.settle()
    lora = LoRARequest("x", 3, str(x))
    llm.engine.residency.preload(lora)
    c = LoRARequest("c", 9, str(paths["C"]))
    llm.engine.add_request("c", {"prompt_token_ids": PROMPT}, PARAMS, c)  # C evicts A
    llm.engine.add_request("doomed", {"prompt_token_ids": PROMPT}, PARAMS, lora)
    put(paths, "B", x)
    threads = _reads_by_thread(monkeypatch)
    llm.engine.add_request("base", {"prompt_token_ids": PROMPT}, PARAMS)
    outputs = _drain(llm)
    assert outputs["doomed"].error_type == "request_failed"
    assert "AdapterChangedError" in outputs["doomed"].error
    assert outputs["c"].outputs[0].token_ids == expected["C"]
    assert outputs["base"].outputs[0].token_ids == expected[None]
    assert threads and all(t.startswith("loragate-adapter-load") for t in threads), threads
    assert llm.engine.residency.counts()["held_weights"] == 0

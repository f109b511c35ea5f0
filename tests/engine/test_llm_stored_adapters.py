"""The offline `LLM`, built with an adapter fetcher (issue 47), serves an adapter named by its
adapter store object: the engine fetches and checks the object, runs its local copy, and the
outputs name the store path they were asked under; the weights are the object's."""

from __future__ import annotations

import pytest
from test_stored_adapter_fetch import PARAMS, PROMPT
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.adapters.store import (
    AdapterFetcher,
    LocalStore,
    ObjectNotFoundError,
    identity_of,
    object_id,
)
from loragate.engine import store_path


def test_an_llm_with_a_fetcher_serves_a_store_object(tiny_model_dir, make_llm, tmp_path):
    model_dir = tiny_model_dir("llama")
    folder = make_adapters(model_dir, tmp_path / "adapters", {"A": (8, ALL_MODULES, False)})["A"]
    oid = object_id(identity_of(folder))
    store = LocalStore(tmp_path / "store")
    store.put(oid, folder)
    llm = make_llm(
        model=str(model_dir),
        max_model_len=128,
        num_kv_blocks=64,
        enable_lora=True,
        max_lora_rank=8,
        adapter_fetcher=AdapterFetcher(store, tmp_path / "cache"),
    )
    stored = LoRARequest("kept", 1, store_path(oid))
    by_folder = LoRARequest("folder", 2, str(folder))
    outs = llm.generate([PROMPT, PROMPT], PARAMS, lora_request=[stored, by_folder])
    assert [out.lora_request for out in outs] == [stored, by_folder]
    assert outs[0].lora_sha256 == outs[1].lora_sha256 == identity_of(folder).sha256
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    missing = LoRARequest("gone", 3, store_path(f"{'0' * 64}-{'0' * 64}"))
    with pytest.raises(ObjectNotFoundError):
        llm.generate(PROMPT, PARAMS, lora_request=missing)

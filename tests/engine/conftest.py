"""Engine fixtures: the default model, tiny random Llama-family models, and a leak check."""

from __future__ import annotations

import gc
import os
import weakref
from pathlib import Path

import pytest
import torch
from tiny_llama import save_tiny_model
from transformers import AutoModelForCausalLM

from loragate.engine import LLM, EngineConfig, LLMEngine
from loragate.engine.api.async_engine import AsyncLLMEngine
from loragate.engine.loading.model_loader import resolve_model

# Engines built since the last check, held until the test that built them is checked; then
# watched weakly, so one a fixture still holds is checked after every later test while one
# nobody holds is freed (each default-model engine holds 1.4-1.7 GB; holding every one the
# suite builds came near the machine's 24 GiB).
NEW_ENGINES: list = []
WATCHED_ENGINES: weakref.WeakSet = weakref.WeakSet()
# Engines are reference cycles, freed by a full collection: one runs when the suite's memory
# passes this, not after every test (a full collection of the suite's heap takes 0.2-0.3 s).
COLLECT_ABOVE_BYTES = 6 * 2**30


def track(llm: LLM) -> LLM:
    NEW_ENGINES.append(llm.engine)
    return llm


@pytest.fixture(autouse=True)
def no_kv_leaks():
    """After every test, every engine it touched has all KV blocks free and consistent."""
    yield
    _check_engines()
    if _resident_bytes() > COLLECT_ABOVE_BYTES:
        gc.collect()


def _check_engines() -> None:
    engines = [*NEW_ENGINES, *WATCHED_ENGINES]
    NEW_ENGINES.clear()
    for engine in engines:
        engine.check_integrity()
        if not engine.has_unfinished_requests():
            stats = engine.get_memory_stats()
            assert stats["allocated_blocks"] == 0, f"KV blocks leaked: {stats}"
        WATCHED_ENGINES.add(engine)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no procfs: never collect early
        return 0


@pytest.fixture(scope="session")
def make_llm():
    """Build an LLM whose KV blocks the leak check watches."""
    return lambda *args, **kwargs: track(LLM(*args, **kwargs))


# Set where the default model cannot be (a GPU machine: its GGUF does not fit the device
# call, benchmarks/gpu_check.py): the tiny models take this folder's tokenizer (`make
# gpu-assets`), and tests that need the default model itself are skipped.
STAND_IN_TOKENIZER = os.environ.get("LORAGATE_TEST_TOKENIZER_DIR")


@pytest.fixture(scope="session")
def default_hf_dir():
    if STAND_IN_TOKENIZER:
        pytest.skip("no default model here: LORAGATE_TEST_TOKENIZER_DIR stands in for it")
    return resolve_model(None).hf_dir


@pytest.fixture(scope="session")
def tokenizer_dir():
    """The default model's tokenizer files, from the stand-in folder where one is set."""
    return Path(STAND_IN_TOKENIZER) if STAND_IN_TOKENIZER else resolve_model(None).hf_dir


@pytest.fixture(scope="session")
def default_llm():
    return track(LLM(max_num_seqs=32, max_model_len=1024, kv_cache_memory_gb=0.5))


@pytest.fixture(scope="session")
def hf_default_model(default_hf_dir):
    return AutoModelForCausalLM.from_pretrained(default_hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir):
    """Factory: the saved tiny test model (tests/tiny_llama.py) of a kind, with the default
    model's tokenizer."""
    made = {}

    def make(kind: str = "llama"):
        if kind not in made:
            made[kind] = save_tiny_model(
                tmp_path_factory.mktemp(f"tiny-{kind}"), tokenizer_dir, kind
            )
        return made[kind]

    return make


@pytest.fixture
def async_engine(tiny_model_dir):
    """An AsyncLLMEngine on the tiny Llama; at the end, shut down with every block back."""
    config = EngineConfig(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=64)
    engine = AsyncLLMEngine(LLMEngine(config))
    yield engine
    engine.shutdown()
    assert engine.engine.get_memory_stats()["allocated_blocks"] == 0
    engine.engine.check_integrity()

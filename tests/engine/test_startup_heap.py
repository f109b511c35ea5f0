"""A running AsyncLLMEngine keeps the process's startup heap out of the cyclic collector's
walks (engine/startup_heap.py), and gives it back when the last engine shuts down."""

from __future__ import annotations

import gc
import weakref

from loragate.engine import EngineConfig, LLMEngine
from loragate.engine.async_engine import AsyncLLMEngine


class Marker:
    """A tracked object of our own, to find among the collector's objects."""


def collected_sees(obj) -> bool:
    return any(o is obj for o in gc.get_objects())


def tiny_engine(tiny_model_dir) -> AsyncLLMEngine:
    config = EngineConfig(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=16)
    return AsyncLLMEngine(LLMEngine(config))


def test_objects_alive_at_start_are_not_walked_while_an_engine_runs(tiny_model_dir):
    before = Marker()
    assert collected_sees(before)
    first = tiny_engine(tiny_model_dir)
    made_while_running = Marker()
    second = tiny_engine(tiny_model_dir)
    try:
        assert not collected_sees(before)
        # Frozen again when the second engine started: what was made since joins.
        assert not collected_sees(made_while_running)
        first.shutdown()
        # One engine still runs: the heap stays frozen.
        assert not collected_sees(before)
    finally:
        first.shutdown()  # twice: counted once
        second.shutdown()
    assert collected_sees(before) and collected_sees(made_while_running)
    assert gc.get_freeze_count() == 0


def test_an_engine_dropped_after_shutdown_is_collected(tiny_model_dir):
    engine = tiny_engine(tiny_model_dir)
    engine.shutdown()
    inner = weakref.ref(engine.engine)
    del engine
    gc.collect()
    assert inner() is None, "the engine's objects stayed frozen after its shutdown"

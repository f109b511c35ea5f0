"""A process that exits while an AsyncLLMEngine runs stops the engine first, so none of its
threads is inside torch while the interpreter tears the modules down."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, atexit, sys
    from loragate.engine import EngineConfig, LLMEngine, SamplingParams
    from loragate.engine.api.async_engine import AsyncLLMEngine

    seen = {}
    # Registered first, so it runs last: after the engine's own exit handler.
    atexit.register(lambda: print("running at exit:", seen["engine"].is_running, flush=True))
    config = EngineConfig(model=sys.argv[1], max_model_len=128, num_kv_blocks=32)
    engine = seen["engine"] = AsyncLLMEngine(LLMEngine(config))

    async def start_one():
        params = SamplingParams(max_tokens=100, ignore_eos=True)
        async for _ in engine.generate({"prompt_token_ids": [1, 2, 3]}, params, "r"):
            return  # one token in; the engine keeps running

    asyncio.run(start_one())
    print("leaving with the engine running:", engine.is_running, flush=True)
    """
)


def test_an_engine_left_running_is_shut_down_at_exit(tiny_model_dir):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_model_dir("llama"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaving with the engine running: True" in done.stdout, done.stdout
    assert "running at exit: False" in done.stdout, done.stdout

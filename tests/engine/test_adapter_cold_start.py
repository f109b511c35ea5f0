"""Cold adapters load off the engine's step: running streams do not stall (issue 12), proved
from what ran where and the engine's step records, not from a wall-clock ratio (issue 58).

Eight base-model streams decode while four requests arrive at once for four adapters in no
memory tier. Every adapter read (reading, hashing, validating its files) is held at a gate
on the thread that runs it, so a load stays pending for as long as the test says:

- the reads run on the loader threads, never on the engine's step thread;
- while the first read is held, every stream keeps decoding (each gains tokens), and the
  cold requests wait without output;
- in every step from the burst to the end, every running decode is in the step (none left
  out for a load or a join) and the prompt tokens stay within the step's budget: a join
  step's extra work is its own prefill chunk, bounded like any other;
- once the reads go on, the cold requests answer exactly what PEFT answers (greedy).

How long a join step takes against the median step on a real model is a benchmark
(benchmarks/cold_join_gaps.py, BENCHMARKS.md), not a test: on a shared 2-core VM single
steps run 2-6x their median for reasons outside the process.
"""

from __future__ import annotations

import asyncio
import threading

from tiny_llama import ALL_MODULES, make_adapters, peft_greedy, peft_model_with

from loragate.adapters import LoRARequest, cpu_tier
from loragate.engine import SamplingParams
from loragate.engine.api.async_engine import AsyncLLMEngine

COLD = {f"cold{i}": (8, ALL_MODULES, False) for i in range(4)}
STREAMS = 8
BURST_AFTER = 8  # stream tokens before the burst of cold requests
HELD_TOKENS = 12  # tokens every stream must gain while the first read is held
COLD_TOKENS = 16
BUDGET = 64  # max_num_batched_tokens: a cold prompt's chunks share steps with the decodes
WAIT_S = 120.0  # a bound on any wait below, never a timing assertion


class HeldReads:
    """Wraps the CPU tier's adapter read: notes the thread of each read and holds every read
    until `release()`."""

    def __init__(self, read):
        self.read = read
        self.threads: list[str] = []
        self.released = threading.Event()

    def __call__(self, *args, **kwargs):
        self.threads.append(threading.current_thread().name)
        if not self.released.wait(WAIT_S):
            raise TimeoutError("the test never released the held adapter reads")
        return self.read(*args, **kwargs)

    def release(self) -> None:
        self.released.set()


async def until(predicate, what: str) -> None:
    """Bounded polling on a condition (the engine runs on its own thread)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


def test_cold_adapters_load_off_the_step_while_streams_decode(
    tiny_model_dir, tmp_path, make_llm, monkeypatch
):
    model_dir = tiny_model_dir("llama")
    adapters = make_adapters(model_dir, tmp_path, COLD)
    held = HeldReads(cpu_tier.load_adapter)
    monkeypatch.setattr(cpu_tier, "load_adapter", held)
    llm = make_llm(
        model=str(model_dir),
        dtype="float32",  # the cold requests' greedy output is compared with PEFT's
        max_model_len=512,
        num_kv_blocks=256,
        max_num_seqs=16,
        max_num_batched_tokens=BUDGET,
        enable_lora=True,
        max_loras=4,
        max_cpu_loras=4,
        max_lora_rank=8,
    )
    loras = [LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(adapters.items())]
    base_prompts = [[1] + [300 + 37 * i + 5 * j for j in range(20 + i)] for i in range(STREAMS)]
    cold_prompts = [[1] + [700 + 13 * i + 3 * j for j in range(40)] for i in range(4)]
    engine = AsyncLLMEngine(llm.engine)
    try:
        run = asyncio.run(_run(engine, llm.engine, held, base_prompts, cold_prompts, loras))
    finally:
        engine.shutdown()
    burst_step, gained, cold_tokens = run

    assert len(held.threads) == 4, held.threads
    assert all(name.startswith("loragate-adapter-load") for name in held.threads), held.threads
    assert min(gained) >= HELD_TOKENS, gained

    records = [r for r in llm.engine.step_records if r.index >= burst_step]
    joins = [r for r in records if any(n > 0 for _, n in r.prefill_chunks)]
    assert len(joins) >= 4, "the cold prompts' prefill steps are among the records"
    for record in records:
        assert record.decodes_left_out == (), record
        assert record.prefill_tokens <= record.budget, record
    assert any(record.decode_seq_ids and record.prefill_tokens for record in joins), (
        "a cold prompt's prefill shared a step with the running decodes"
    )
    stats = llm.engine.residency.counts()
    assert stats["disk_loads"] == 4 and stats["slot_loads"] == 4, stats

    peft_model = peft_model_with(model_dir, adapters)
    for lora, prompt, tokens in zip(loras, cold_prompts, cold_tokens, strict=True):
        assert tokens == peft_greedy(peft_model, lora.lora_name, prompt, COLD_TOKENS), lora


async def _run(engine, llm_engine, held, base_prompts, cold_prompts, loras):
    """The first step after the burst, the tokens each stream gained while the first read
    was held, and each cold request's tokens."""
    stream = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=COLD_TOKENS, min_tokens=COLD_TOKENS)
    counts = [0] * len(base_prompts)
    cold_outputs = [0] * len(cold_prompts)
    burst, cold_done = asyncio.Event(), asyncio.Event()

    async def base(i: int):
        after = 0
        request = {"prompt_token_ids": base_prompts[i]}
        async for out in engine.generate(request, stream, f"base{i}"):
            assert out.error is None and not out.finished, "streams outlast the cold requests"
            counts[i] = len(out.outputs[0].token_ids)
            if min(counts) >= BURST_AFTER:
                burst.set()
            after += cold_done.is_set()
            if after > 4:
                break

    async def cold(i: int):
        await burst.wait()
        request = {"prompt_token_ids": cold_prompts[i]}
        async for out in engine.generate(request, greedy, f"cold{i}", lora_request=loras[i]):
            assert out.error is None, out.error
            cold_outputs[i] += 1
            last = out
        return last.outputs[0].token_ids

    async def burst_and_hold():
        await burst.wait()
        burst_step = len(llm_engine.step_records) and llm_engine.step_records[-1].index
        tasks = [asyncio.create_task(cold(i)) for i in range(len(cold_prompts))]
        await until(lambda: held.threads, "the first cold read to start")
        before = list(counts)
        await until(
            lambda: all(c - b >= HELD_TOKENS for c, b in zip(counts, before, strict=True)),
            f"every stream to gain {HELD_TOKENS} tokens while a read is held",
        )
        gained = [c - b for c, b in zip(counts, before, strict=True)]
        assert cold_outputs == [0] * len(cold_prompts), "a cold request answered unloaded"
        held.release()
        tokens = await asyncio.gather(*tasks)
        cold_done.set()
        return burst_step, gained, tokens

    *_, (burst_step, gained, cold_tokens) = await asyncio.gather(
        *(base(i) for i in range(len(base_prompts))), burst_and_hold()
    )
    await until(lambda: not engine.num_requests, "the streams' aborts to reach the engine")
    return burst_step, gained, cold_tokens

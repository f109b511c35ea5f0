"""vLLM's engine arguments as the seed uses them: tensor_parallel_size, enforce_eager,
EngineArgs / AsyncEngineArgs and from_engine_args, an int request_id, and llm.llm_engine's
block counts."""

from __future__ import annotations

import asyncio
from dataclasses import FrozenInstanceError, fields

import pytest
from click.testing import CliRunner

from loragate.engine import (
    LLM,
    AsyncEngineArgs,
    AsyncLLMEngine,
    EngineArgs,
    EngineConfig,
    LLMEngine,
    SamplingParams,
)
from loragate.gateway.assembly.cli import main

TP_REFUSAL = "tensor_parallel_size=2: tensor parallelism is not supported yet"


@pytest.mark.parametrize(
    "build",
    [
        lambda: LLM(tensor_parallel_size=2),
        lambda: EngineConfig(tensor_parallel_size=2),
        lambda: EngineArgs(tensor_parallel_size=2),
        lambda: AsyncEngineArgs(tensor_parallel_size=2, max_model_len=4096),
    ],
)
def test_tensor_parallel_above_one_is_refused_pointing_to_replicas(build):
    with pytest.raises(ValueError, match=TP_REFUSAL) as caught:
        build()
    assert "replicas" in str(caught.value)


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "1"])
def test_bad_tensor_parallel_size_names_it(value):
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(tensor_parallel_size=value)


def test_seed_arguments_are_accepted():
    config = EngineConfig(
        tensor_parallel_size=1,
        max_model_len=4096,
        gpu_memory_utilization=0.9,
        block_size=16,
        swap_space=4,
        max_num_batched_tokens=16384,
        max_num_seqs=512,
        enforce_eager=False,
    )
    assert config.tensor_parallel_size == 1 and config.enforce_eager is False
    assert EngineConfig(enforce_eager=True).enforce_eager is True
    with pytest.raises(ValueError, match="enforce_eager"):
        EngineConfig(enforce_eager="yes")


@pytest.mark.parametrize(
    "build",
    [
        lambda: LLM(tensor_parallel_sise=1),
        lambda: EngineConfig(tensor_parallel_sise=1),
        lambda: EngineArgs(tensor_parallel_sise=1),
        lambda: AsyncEngineArgs(tensor_parallel_sise=1),
    ],
)
def test_unknown_keyword_is_a_type_error_naming_it(build):
    with pytest.raises(TypeError, match="unexpected keyword argument 'tensor_parallel_sise'"):
        build()


def test_engine_args_have_exactly_the_engine_config_fields():
    for args in (EngineArgs, AsyncEngineArgs):
        got = [(f.name, f.default, f.default_factory) for f in fields(args)]
        want = [(f.name, f.default, f.default_factory) for f in fields(EngineConfig)]
        assert got == want
    assert issubclass(AsyncEngineArgs, EngineArgs)


def test_engine_args_are_checked_when_built_and_again_when_converted():
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineArgs(max_num_seqs=0)
    args = AsyncEngineArgs(max_model_len=4096, gpu_memory_utilization=0.9, plugins=["m:o"])
    config = args.create_engine_config()
    assert isinstance(config, EngineConfig) and config.plugins == ("m:o",)
    assert config.max_model_len == 4096 and config.gpu_memory_utilization == 0.9
    args.block_size = 7  # mutable, as vLLM's; the conversion checks again
    with pytest.raises(ValueError, match="block_size"):
        args.create_engine_config()


def test_from_engine_args_refuses_anything_else():
    with pytest.raises(TypeError, match="EngineArgs or AsyncEngineArgs, got dict"):
        LLMEngine.from_engine_args({"max_model_len": 64})
    with pytest.raises(TypeError, match="got EngineConfig"):
        AsyncLLMEngine.from_engine_args(EngineConfig())


def tiny_args(cls, model_dir):
    return cls(model=str(model_dir), max_model_len=128, num_kv_blocks=32, block_size=8)


def test_llm_engine_from_engine_args_generates(tiny_model_dir):
    engine = LLMEngine.from_engine_args(tiny_args(EngineArgs, tiny_model_dir("llama")))
    assert engine.config.num_kv_blocks == 32 and engine.config.block_size == 8
    engine.add_request("a", {"prompt_token_ids": [1, 5, 6]}, SamplingParams(max_tokens=3))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3


def test_async_engine_from_engine_args_takes_the_seeds_call_shape(tiny_model_dir):
    """engine.generate(prompt, params, request_id=1): an int id, given back as it was."""
    engine = AsyncLLMEngine.from_engine_args(tiny_args(AsyncEngineArgs, tiny_model_dir("llama")))
    params = SamplingParams(temperature=0.7, max_tokens=4, seed=1)

    async def stream(request_id):
        prompt = {"prompt_token_ids": [1, 5, 6]}
        return [o async for o in engine.generate(prompt, params, request_id=request_id)]

    async def both():
        return await asyncio.gather(stream(1), stream(("tenant", 2)))

    try:
        by_int, by_tuple = asyncio.run(both())
        assert {o.request_id for o in by_int} == {1}
        assert {o.request_id for o in by_tuple} == {("tenant", 2)}
        assert by_int[-1].finished and len(by_int[-1].outputs[0].token_ids) == 4
        for bad in (["not", "hashable"], None):
            with pytest.raises(TypeError, match="request_id must be hashable"):
                asyncio.run(stream(bad))
    finally:
        engine.shutdown()


def test_llm_engine_block_counts_add_up_during_and_after_a_run(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=40)
    assert llm.llm_engine is llm.engine
    blocks = llm.llm_engine.scheduler.block_manager
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    for i in range(3):
        prompt = {"prompt_token_ids": list(range(1 + 30 * i, 30 + 30 * i))}  # no shared prefix
        llm.llm_engine.add_request(f"r{i}", prompt, params)
    seen = []
    while llm.llm_engine.has_unfinished_requests():
        llm.llm_engine.step()
        seen.append((blocks.num_allocated_blocks, blocks.num_free_blocks))
        assert blocks.num_allocated_blocks + blocks.num_free_blocks == blocks.num_total_blocks
        stats = llm.get_memory_stats()  # the same truth as the engine's own stats
        assert (stats["allocated_blocks"], stats["free_blocks"]) == seen[-1]
    assert max(allocated for allocated, _ in seen) >= 3 * 3  # 3 requests of 3+ blocks of 16
    assert blocks.num_allocated_blocks == 0 and blocks.num_free_blocks == 40
    assert blocks.num_total_blocks == 40
    with pytest.raises(AttributeError):
        blocks.num_free_blocks = 7  # a view: the engine alone changes these


def test_engine_config_stays_frozen():
    with pytest.raises(FrozenInstanceError):
        EngineConfig().tensor_parallel_size = 2


def test_cli_mirrors_the_new_engine_fields():
    help_text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--tensor-parallel-size" in help_text and "--enforce-eager" in help_text
    result = CliRunner().invoke(main, ["serve", "--tensor-parallel-size", "2"])
    assert result.exit_code == 2 and "tensor parallelism is not supported yet" in result.output

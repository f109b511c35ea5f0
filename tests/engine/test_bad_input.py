"""Bad input is a clear error raised before any KV block is touched; serving goes on."""

from __future__ import annotations

import pytest

from loragate.engine import LLM, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_model_dir, make_llm):
    return make_llm(model=str(tiny_model_dir("llama")), max_model_len=64, num_kv_blocks=32)


def _still_serves(llm):
    out = llm.generate("hello there", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


@pytest.mark.parametrize(
    "prompt, match",
    [
        ("", "prompt is empty"),
        ({"prompt_token_ids": []}, "prompt is empty"),
        ({"prompt_token_ids": list(range(1, 65))}, "prompt has 64 tokens; max_model_len is 64"),
        ({"prompt_token_ids": [1, 10**9]}, "outside the vocabulary"),
        ({"prompt_token_ids": "abc"}, "list of integers"),
        (123, "prompt must be a string"),
        ({"prompt": "hi", "add_special_tokens": "yes"}, "add_special_tokens must be true or"),
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": ["hi"]}, "prompt must be a string, got list"),
    ],
)
def test_bad_prompts(tiny, prompt, match):
    with pytest.raises(ValueError, match=match):
        tiny.generate(prompt, SamplingParams(max_tokens=4), use_tqdm=False)
    assert tiny.get_memory_stats()["allocated_blocks"] == 0
    assert not tiny.engine.has_unfinished_requests()
    _still_serves(tiny)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_one_bad_prompt_in_a_list_fails_the_call_and_leaves_nothing_behind(tiny):
    with pytest.raises(ValueError, match="prompt is empty"):
        tiny.generate(["fine", ""], SamplingParams(max_tokens=4), use_tqdm=False)
    assert not tiny.engine.has_unfinished_requests()
    _still_serves(tiny)


def test_lora_request_without_enable_lora(tiny_model_dir, make_llm):
    from loragate.adapters import LoRARequest

    base_only = make_llm(
        model=str(tiny_model_dir("llama")), max_model_len=64, num_kv_blocks=32, enable_lora=False
    )
    assert base_only.engine.residency is None  # no adapter machinery at all
    with pytest.raises(ValueError, match="enable_lora=True"):
        base_only.generate("hi", lora_request=LoRARequest("x", 1, "/nowhere"), use_tqdm=False)
    _still_serves(base_only)


def test_lora_is_on_by_default_as_at_the_cli(tiny):
    """One default for `enable_lora`: on, in EngineConfig (LLM, AsyncLLMEngine) and at the CLI."""
    from loragate.gateway.assembly.serve_command import serve

    assert EngineConfig.__dataclass_fields__["enable_lora"].default is True
    assert tiny.engine.residency is not None
    (flag,) = [p for p in serve.params if p.name == "enable_lora"]
    assert flag.default is True and "--disable-lora" in flag.secondary_opts


def test_unknown_model_path():
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(model="/no/such/model")


def test_directory_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LLM(model=str(tmp_path))


def test_corrupt_weights_file(tiny_model_dir, tmp_path):
    src = tiny_model_dir("llama")
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="corrupt weights file .*model.safetensors"):
        LLM(model=str(tmp_path))


def test_pickle_weights_refused(tiny_model_dir, tmp_path):
    src = tiny_model_dir("llama")
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(FileNotFoundError, match="pickle weights are refused"):
        LLM(model=str(tmp_path))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 5}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"kv_cache_memory_gb": -1}, "kv_cache_memory_gb"),
        ({"dtype": "float8"}, "dtype"),
        ({"max_num_batched_tokens": 8, "max_num_seqs": 16}, "max_num_batched_tokens"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_engine_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig(**kwargs)


def test_kv_cache_too_small_for_max_model_len(tiny_model_dir):
    with pytest.raises(ValueError, match="needs 8"):
        LLM(model=str(tiny_model_dir("llama")), max_model_len=128, num_kv_blocks=4)


def test_swap_mode_with_swap_space_for_no_block_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="swap_space=1e-09 GiB holds no KV block"):
        LLM(
            model=str(tiny_model_dir("llama")),
            max_model_len=128,
            num_kv_blocks=16,
            preemption_mode="swap",
            swap_space=1e-9,
        )

"""The gateway's small parts on their own: path checks, queue bound,
stream deltas, error-field naming, settings and the in-memory registry."""

from __future__ import annotations

import asyncio

import pytest

from loragate.adapters import LoRARequest
from loragate.engine import CompletionOutput, EngineConfig, InvalidParam
from loragate.gateway.adapter_control.paths import AdapterPathError, resolve_adapter_dir
from loragate.gateway.adapter_control.served_adapters import AdapterRecord, InMemoryAdapterRegistry
from loragate.gateway.errors import QueueFullError, param_of
from loragate.gateway.openai.format import DeltaTracker
from loragate.gateway.serving.admission import Admission
from loragate.gateway.settings import GatewaySettings
from loragate.registry import AdapterMetadata, check_served_name


@pytest.fixture
def root(tmp_path):
    (tmp_path / "root" / "a" / "nested").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "out-link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "root" / "in-link").symlink_to(tmp_path / "root" / "a")
    (tmp_path / "root" / "loop").symlink_to(tmp_path / "root" / "loop")
    (tmp_path / "root" / "file").write_text("x")
    return tmp_path / "root"


def test_paths_resolve_inside_the_root_only(root):
    assert resolve_adapter_dir(root, "a") == root / "a"
    assert resolve_adapter_dir(root, "a/nested/..") == root / "a"
    assert resolve_adapter_dir(root, str(root / "a" / "nested")) == root / "a" / "nested"
    assert resolve_adapter_dir(root, "in-link") == root / "a"  # the real path is what loads
    for bad in (
        "out-link",
        "../elsewhere",
        "a/../../elsewhere",
        str(root.parent),
        "..",
        "loop",
        "file",
        "missing",
        "",
        "   ",
        "a\x00b",
    ):
        with pytest.raises(AdapterPathError):
            resolve_adapter_dir(root, bad)
    with pytest.raises(AdapterPathError, match="--adapter-root"):
        resolve_adapter_dir(None, "a")


def test_path_errors_never_show_the_server_root_and_long_paths_are_refused_unread(root):
    cases = {
        "loop": "'loop'",
        str(root / "loop"): "'<adapter-root>/loop'",
        str(root / "loop" / "x"): "'<adapter-root>/loop/x'",
        str(root.parent / "elsewhere"): "<absolute path>",
        "a" * 4000: "4000 characters",
        "/".join(["b" * 200] * 50): "at most 1024",
        "a/" + "c" * 300: "component of 300 characters",
    }
    for path, shown in cases.items():
        with pytest.raises(AdapterPathError) as info:
            resolve_adapter_dir(root, path)
        message = str(info.value)
        assert shown in message, message
        assert str(root) not in message and str(root.parent) not in message
        assert len(message) < 400


def test_admission_counts_sequences_and_refuses_past_capacity():
    admission = Admission(max_running=2, max_queue=1, retry_after_seconds=3)
    admission.admit(2)
    assert admission.waiting == 0
    admission.admit(1)
    assert admission.waiting == 1
    with pytest.raises(QueueFullError) as refused:
        admission.admit(1)
    assert refused.value.headers == {"Retry-After": "3"} and refused.value.status_code == 429
    assert admission.in_flight == 3 and admission.rejected == 1
    admission.release(2)
    admission.admit(2)
    assert admission.in_flight == 3


def choice(text, ids, finish=None, logprobs=None):
    return CompletionOutput(0, text, ids, 0.0, logprobs, finish_reason=finish)


def test_delta_tracker_sends_every_character_and_token_once():
    tracker = DeltaTracker()
    assert tracker.step(choice("He", [1]), with_tokens=False).text == "He"
    assert tracker.step(choice("He", [1, 2]), with_tokens=False) is None  # text held back
    second = tracker.step(choice("He", [1, 2]), with_tokens=True)
    assert second.text == "" and second.token_ids == [2]
    lp = [{1: -0.1}, {2: -0.2}, {3: -0.3}]
    last = tracker.step(choice("Hello", [1, 2, 3], "stop", lp), with_tokens=True)
    assert (last.text, last.token_ids, last.logprobs, last.finish_reason, last.text_offset) == (
        "llo",
        [3],
        [{3: -0.3}],
        "stop",
        2,
    )
    assert tracker.step(choice("Hello", [1, 2, 3], "stop"), with_tokens=True) is None


def test_param_of_names_the_api_field():
    names = {"max_tokens": "max_completion_tokens", "sampler": "sampler", "prompt": "messages"}
    refused = InvalidParam("max_tokens", "max_tokens must be an integer >= 1")
    assert param_of(refused, names) == "max_completion_tokens"
    assert param_of(InvalidParam("sampler", "unknown sampler 'x'"), names) == "sampler"
    assert param_of(InvalidParam("prompt", "prompt has 600 tokens"), names) == "messages"
    assert param_of(ValueError("prompt has 600 tokens"), names) is None  # no field carried


def test_settings_are_checked():
    GatewaySettings(engine=EngineConfig(), port=0, max_queue=0)
    for bad in (
        {"port": -1},
        {"port": True},
        {"max_queue": -1},
        {"max_body_bytes": 10},
        {"shutdown_timeout": -1},
        {"retry_after_seconds": 0},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GatewaySettings(**bad)
    with pytest.raises(FileNotFoundError, match="adapter_root"):
        GatewaySettings(adapter_root="/no/such/dir")


def test_adapter_names_are_checked():
    assert check_served_name("sql-v2:latest", "base") == "sql-v2:latest"
    for bad in ("", "a/b", "-a", "a b", "x" * 129, "base", None):
        with pytest.raises(ValueError):
            check_served_name(bad, "base")


def test_in_memory_registry_replacement():
    def record(name, lora_id):
        meta = AdapterMetadata(
            name=name,
            base_model="base",
            rank=4,
            alpha=8.0,
            target_modules=("q_proj",),
            sha256="0" * 64,
            size_bytes=1,
            path="p",
            lora_int_id=lora_id,
            created_at=0,
        )
        return AdapterRecord(meta, LoRARequest(name, lora_id, "/p"), "rest")

    async def scenario():
        registry = InMemoryAdapterRegistry()
        first, second = 1, 2  # lora_int_ids come from the registry store
        assert await registry.put(record("a", first)) is None
        replaced = await registry.put(record("a", second))
        assert replaced.lora_request.lora_int_id == first
        assert [r.lora_request.lora_int_id for r in await registry.list()] == [second]
        assert (await registry.remove("a")).name == "a"
        assert await registry.remove("a") is None and await registry.get("a") is None

    asyncio.run(scenario())

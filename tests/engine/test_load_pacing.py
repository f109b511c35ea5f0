"""Adapter loads pause between chunks only while the engine has sequences running: a load
then slows the running steps by a fraction of its cost, and an idle engine loads at full
speed (issue 12: paced idle loads took 1.3 s instead of 0.16 s)."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
import torch
from tiny_llama import make_adapters

from loragate.adapters import LoadPacing, LoRARequest
from loragate.adapters.pacing import WINDOW_SHARE
from loragate.engine import EngineConfig, SamplingParams

ADAPTERS = {"first": (8, ("q_proj", "v_proj", "down_proj"), False)}
ADAPTERS_2 = {"second": (8, ("q_proj", "v_proj", "down_proj"), False)}


def test_pauses_are_asked_of_busy_before_each_one():
    pauses, busy = [], [True]
    pacing = LoadPacing(ratio=2.0, busy=lambda: busy[0], sleep=pauses.append)
    pacing.pause_after(0.0)  # started long ago: a positive pause
    busy[0] = False
    pacing.pause_after(0.0)
    assert len(pauses) == 1 and pauses[0] > 0
    LoadPacing(ratio=0.0, sleep=pauses.append).pause_after(0.0)
    assert len(pauses) == 1


def test_a_pause_is_a_multiple_of_the_loaders_cpu_time_not_of_its_wall_time():
    """A loader waiting for a core (here: sleeping) spends wall time but no CPU time and is
    owed no pause for it; CPU time it spends is paused for `ratio` times over. Pacing by the
    wall time left a loader beside a step that fills the cores a 27th of one, not a 9th."""
    assert LoadPacing().clock is time.thread_time
    pauses = []
    pacing = LoadPacing(ratio=8.0, busy=lambda: True, sleep=pauses.append)
    began = pacing.now()
    time.sleep(0.05)
    pacing.pause_after(began)
    began = pacing.now()
    while time.thread_time() - began < 0.02:
        pass
    pacing.pause_after(began)
    assert pauses[0] < 0.02, "waiting for a core costs no pause"
    assert pauses[1] >= 8 * 0.02, "CPU time is paused for ratio times over"


def test_python_loops_of_a_load_pause_every_few_items():
    pauses, busy = [], [True]
    pacing = LoadPacing(ratio=2.0, busy=lambda: busy[0], sleep=pauses.append)
    items = list(range(50))
    assert list(pacing.paced(items, every=16)) == items
    assert len(pauses) == 3  # after items 16, 32 and 48
    busy[0] = False
    assert list(pacing.paced(items, every=16)) == items
    assert len(pauses) == 3


def test_a_paced_load_pauses_while_it_parses_and_checks_the_tensors(tmp_path):
    """A file's tensors are parsed and checked in paced steps, not in one stretch that holds
    the GIL (each step's torch ops wait for it), as the read is."""
    from safetensors.torch import save_file

    from loragate.adapters import safetensors_views
    from loragate.adapters.pacing import ITEMS_PER_PAUSE

    count = 5 * ITEMS_PER_PAUSE + 3
    save_file({f"t{i}": torch.zeros(2) for i in range(count)}, tmp_path / "w.safetensors")
    data = (tmp_path / "w.safetensors").read_bytes()
    pauses = []
    pacing = LoadPacing(busy=lambda: True, sleep=pauses.append)
    views = safetensors_views.tensor_views(memoryview(data), pacing)
    assert len(views) == count and len(pauses) == 5


def test_the_engine_paces_loads_only_while_sequences_run(tiny_model_dir, make_llm, tmp_path):
    """Beside running sequences a load takes turns with the steps: it parks at its pauses
    and runs in the windows the engine lends between two steps (adapters/pacing.py), with
    no pause by its CPU time on top. With nothing running it goes at full speed."""
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path, {**ADAPTERS, **ADAPTERS_2})
    llm = make_llm(str(model_dir), max_model_len=256, enable_lora=True, max_loras=2)
    engine = llm.llm_engine
    pauses: list[float] = []
    residency = engine.residency
    residency.load_pacing = dataclasses.replace(residency.load_pacing, sleep=pauses.append)
    windows = engine.residency.windows
    assert residency.load_pacing.windows is windows

    residency.preload(LoRARequest("first", 1, str(paths["first"])))  # nothing runs: no pause
    assert pauses == [] and windows.lent == 0

    params = SamplingParams(temperature=0, max_tokens=240, ignore_eos=True)
    engine.add_request("running", {"prompt_token_ids": [5, 6, 7, 8]}, params)
    engine.step()
    assert engine.scheduler.running, "a sequence runs while the second adapter loads"
    # On another thread (a server's loader), beside the steps: in turns with them.
    loader = threading.Thread(
        target=residency.preload, args=(LoRARequest("second", 2, str(paths["second"])),)
    )
    loader.start()
    while loader.is_alive():
        assert engine.scheduler.running, "the sequence ended before the load did"
        engine.step()
    loader.join()
    assert residency.counts()["file_reads"] == 2
    # a turn per chunk read and hashed, per stacked module: the load took its turns
    assert windows.lent >= 1
    lent_steps = [r for r in engine.step_records if r.load_window_ms > 0]
    assert len(lent_steps) == windows.lent
    assert pauses == [], "a load given windows also paused by its CPU time"
    engine.abort_request("running")


def test_the_operator_sets_the_windows_share(tiny_model_dir, make_llm):
    """--adapter-load-window-share reaches the engine's windows; a share outside (0, 4] is
    refused with its name."""
    model_dir = str(tiny_model_dir("llama"))
    llm = make_llm(model_dir, enable_lora=True, max_loras=2, adapter_load_window_share=0.75)
    assert llm.llm_engine.residency.windows.share == 0.75
    default = make_llm(model_dir, enable_lora=True, max_loras=2)
    assert default.llm_engine.residency.windows.share == WINDOW_SHARE
    for bad in (0, -0.5, 5, "half", True):
        with pytest.raises(ValueError, match="adapter_load_window_share"):
            EngineConfig(model=model_dir, adapter_load_window_share=bad)


def test_a_load_on_the_stepping_thread_is_not_paced(tiny_model_dir, make_llm, tmp_path):
    """The offline engine reads a cold adapter in add_request, on the thread that runs the
    steps: no step runs until the read is done, so pausing it would only stall every
    running sequence for the pauses' length (8 times the read's)."""
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path, ADAPTERS_2)
    llm = make_llm(str(model_dir), max_model_len=128, enable_lora=True, max_loras=2)
    engine = llm.llm_engine
    pauses: list[float] = []
    residency = engine.residency
    residency.load_pacing = dataclasses.replace(residency.load_pacing, sleep=pauses.append)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine.add_request("running", {"prompt_token_ids": [5, 6, 7, 8]}, params)
    engine.step()
    assert engine.scheduler.running
    lora = LoRARequest("second", 2, str(paths["second"]))
    engine.add_request("cold", {"prompt_token_ids": [5, 6]}, params, lora_request=lora)
    assert residency.counts()["file_reads"] == 1, "the cold adapter was read in add_request"
    assert pauses == [], "a load on the stepping thread paused"
    engine.abort_request("running")
    engine.abort_request("cold")


class CountingWindows:
    """Stands in for the engine's LoadWindows: a load always waits, each window is 1 ms."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.lent_before: list[int] = []  # the index of the step each window came before

    def observe(self, step_seconds: float) -> None:
        pass

    def lend(self) -> float:
        records = self.engine.step_records
        self.lent_before.append(records[-1].index + 1 if records else 0)
        return 0.001


def test_no_window_comes_before_a_step_that_brings_an_adapter_into_a_slot(
    tiny_model_dir, make_llm, tmp_path
):
    """That step runs the request's first prompt tokens and LoRA rows, the longest step the
    streams see when an adapter joins; a window before it would add to the gap."""
    model_dir = tiny_model_dir("llama")
    paths = make_adapters(model_dir, tmp_path, ADAPTERS)
    llm = make_llm(str(model_dir), max_model_len=128, enable_lora=True, max_loras=2)
    engine = llm.llm_engine
    engine.residency.preload(LoRARequest("first", 1, str(paths["first"])))  # CPU tier only
    windows = engine.residency.windows = CountingWindows(engine)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request("base", {"prompt_token_ids": [5, 6, 7, 8]}, params)
    for _ in range(3):
        engine.step()
    lora = LoRARequest("first", 1, str(paths["first"]))
    engine.add_request("joins", {"prompt_token_ids": [5, 6, 7]}, params, lora_request=lora)
    while engine.has_unfinished_requests():
        engine.step()
    join = [r for r in engine.step_records if r.prefill_chunks and r.index > 2]
    assert len(join) == 1, "the adapter's request joined in one step"
    assert join[0].index not in windows.lent_before
    assert {join[0].index - 1, join[0].index + 1} <= set(windows.lent_before)
    assert all(r.load_window_ms > 0 for r in engine.step_records if r.index in windows.lent_before)

"""A GPU's slot copies beside the step (adapters/slot_copies.py), run on the CPU through
recorded stream operations (tests/recorded_streams.py): a write goes a layer at a time on the
side stream, each layer's rows whole when its event is marked and the later layers' not yet
touched; the slots end bit-equal to a write at once (a stack covering the slot, a smaller
rank's rows zeroed first, a module whose layers differ in rank copied row by row); the step
waits for each pending layer once, and for the latest write's event."""

from __future__ import annotations

import pytest
import torch
from recorded_streams import RecordedStreams

from loragate.adapters import LoRARequest, load_adapter
from loragate.adapters.slot_copies import SlotCopies
from loragate.adapters.slots import DeviceSlots
from loragate.engine.lora.adapter_residency import AdapterResidency

MAX_RANK = 16
SLOT = 1


def snapshot(slots: DeviceSlots) -> dict:
    return {m: (slots.a[m].clone(), slots.bt[m].clone()) for m in slots.spec.modules}


def three_adapters(spec, make_adapter):
    made = [
        make_adapter("all", rank=8, targets=list(spec.modules), seed=1),
        make_adapter("qv", rank=4, seed=2),  # a smaller rank over the same slot
        make_adapter(
            "uneven",
            rank=8,
            targets=["q_proj", "up_proj"],
            rank_pattern={"layers.1.mlp.up_proj": 2},
            seed=3,
        ),
    ]
    adapters = [load_adapter(path, spec, MAX_RANK) for path in made]
    assert "up_proj" not in adapters[2].stacked, "its layers differ in rank: no stack"
    assert "q_proj" in adapters[2].stacked
    return adapters


def test_a_write_goes_a_layer_at_a_time_and_ends_as_a_write_at_once(spec, make_adapter):
    layers = spec.num_layers
    assert layers >= 2
    streams = RecordedStreams()
    pipelined = DeviceSlots(
        spec, 2, MAX_RANK, "cpu", torch.float32, copies=SlotCopies(layers, streams)
    )
    at_once = DeviceSlots(spec, 2, MAX_RANK, "cpu", torch.float32)
    assert pipelined.copies.streams is not None and at_once.copies.streams is None
    checked = []
    for adapter in three_adapters(spec, make_adapter):
        before = snapshot(pipelined)
        at_once.write(SLOT, adapter)

        def whole_up_to_its_layer(event: int, before=before) -> None:
            layer = event % layers  # every write marks one event per layer, in order
            for module in spec.modules:
                for mine, want, old in zip(
                    (pipelined.a[module], pipelined.bt[module]),
                    (at_once.a[module], at_once.bt[module]),
                    before[module],
                    strict=True,
                ):
                    assert torch.equal(mine[: layer + 1, SLOT], want[: layer + 1, SLOT])
                    assert torch.equal(mine[layer + 1 :], old[layer + 1 :]), "later layers wait"
                    assert torch.equal(mine[:, 1 - SLOT], old[:, 1 - SLOT])
            checked.append(event)

        streams.on_mark = whole_up_to_its_layer
        pipelined.write(SLOT, adapter)
        assert pipelined.copies.pending == list(range(layers))
        for module in spec.modules:
            assert torch.equal(pipelined.a[module], at_once.a[module]), module
            assert torch.equal(pipelined.bt[module], at_once.bt[module]), module
            assert pipelined._dirty[module] == at_once._dirty[module], module
        pipelined.wait_all()
    assert checked == list(range(3 * layers))
    sides = [i for i, entry in enumerate(streams.log) if entry == ("side",)]
    assert len(sides) == 3, "each write enters the side stream once, after the step's work"
    # The second adapter (rank 4 on q and v) left no row of the first (rank 8 everywhere),
    # and the third's uneven up_proj has rank 2 in layer 1.
    assert not pipelined.a["k_proj"][:, SLOT].any()
    assert (
        pipelined.a["up_proj"][0, SLOT, :8].any() and not pipelined.a["up_proj"][0, SLOT, 8:].any()
    )
    assert (
        pipelined.a["up_proj"][1, SLOT, :2].any() and not pipelined.a["up_proj"][1, SLOT, 2:].any()
    )


def test_the_step_waits_for_each_pending_layer_once_and_for_the_latest_write():
    streams = RecordedStreams()
    copies = SlotCopies(3, streams)
    written = []
    copies.run(written.append)
    assert written == [range(0, 1), range(1, 2), range(2, 3)]
    assert copies.pending == [0, 1, 2]
    copies.ready(1)
    copies.ready(1)
    assert streams.log[-1] == ("wait", 1) and streams.log.count(("wait", 1)) == 1
    copies.run(written.append)  # events 3, 4, 5: layer 1's new copy is pending again
    assert copies.pending == [0, 1, 2]
    copies.ready(0)
    assert streams.log[-1] == ("wait", 3), "layer 0 waits for its latest copy"
    copies.wait_all()
    assert streams.log[-2:] == [("wait", 4), ("wait", 5)]
    assert copies.pending == []
    assert ("wait", 0) not in streams.log and ("wait", 2) not in streams.log


def test_without_streams_a_write_runs_at_once_and_nothing_waits():
    copies = SlotCopies(4)
    written = []
    copies.run(written.append)
    assert written == [range(0, 4)]
    assert copies.streams is None and copies.pending == []
    copies.ready(2)
    copies.wait_all()
    assert SlotCopies.for_device(4, torch.device("cpu")).streams is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_write_runs_on_the_side_stream_from_pinned_stacks(spec, make_adapter):
    path = make_adapter("all", rank=8, targets=list(spec.modules), seed=1)
    adapter = load_adapter(path, spec, MAX_RANK, pin_memory=True)
    assert all(a.is_pinned() and bt.is_pinned() for _, a, bt in adapter.stacked.values())
    slots = DeviceSlots(spec, 2, MAX_RANK, "cuda", torch.float32)
    assert slots.copies.streams is not None, "a CUDA device's slots copy beside the step"
    at_once = DeviceSlots(spec, 2, MAX_RANK, "cpu", torch.float32)
    at_once.write(SLOT, adapter)
    slots.write(SLOT, adapter)
    assert slots.copies.pending == list(range(spec.num_layers))
    for layer in range(spec.num_layers):
        slots.ready(layer)
    assert slots.copies.pending == []
    for module in spec.modules:
        assert torch.equal(slots.a[module].cpu(), at_once.a[module]), module
        assert torch.equal(slots.bt[module].cpu(), at_once.bt[module]), module


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_cpu_tier_stacks_in_the_slots_dtype_pinned(spec, make_adapter):
    """A bf16 GPU's stacks are bf16 and pinned: the slot copy converts nothing, so it runs
    beside the step rather than through a pageable temporary."""
    path = make_adapter("all", rank=8, targets=list(spec.modules), seed=1)
    residency = AdapterResidency(
        spec,
        max_loras=2,
        max_lora_rank=MAX_RANK,
        max_cpu_loras=2,
        device="cuda",
        dtype=torch.bfloat16,
    )
    request = LoRARequest("all", 1, str(path))
    in_cpu_tier = residency.preload(request)  # the CPU tier's own copy
    slot = residency.acquire_slot(request, set())
    stacked = list(in_cpu_tier.stacked.values())
    assert stacked and all(
        a.dtype == torch.bfloat16 and a.is_pinned() and bt.is_pinned() for _, a, bt in stacked
    )
    residency.slot_tensors.wait_all()
    reference = load_adapter(path, spec, MAX_RANK, stack_dtype=torch.bfloat16)
    for module, (first, a, bt) in reference.stacked.items():
        rank = a.shape[1]
        assert torch.equal(residency.slot_tensors.a[module][first:, slot, :rank].cpu(), a), module
        assert torch.equal(residency.slot_tensors.bt[module][first:, slot, :rank].cpu(), bt), module

"""The lm_head LoRA of every slot added in one batched call (engine/models/decoder.py
``_add_head_lora``), on the torch/native path and on the Triton kernels the CUDA path runs
(under the interpreter without a GPU): slots of ranks 2, 8 and 5 with their own scales, a
slot with a vocabulary side but no lm_head LoRA, a slot with no adapter side at all and base
rows, in one batch whose sampled rows are a subset of its tokens, against a float64
per-row reference; rows without an lm_head LoRA keep their logits bit for bit."""

from __future__ import annotations

import pytest
import torch

from loragate import kernels
from loragate.adapters.slots import DeviceSlots
from loragate.adapters.spec import LoRAModelSpec
from loragate.adapters.vocab_extras import VocabExtras
from loragate.engine.models.decoder import _add_head_lora
from loragate.engine.runner.forward_batch import LoRABatch

HIDDEN, VOCAB, MAX_RANK, SLOTS = 24, 70, 8, 6
HEADS = {0: (2, 0.5), 2: (8, 2.0), 5: (5, 1.25)}  # slot: (rank, scale)


def slots_with_heads(device) -> tuple[DeviceSlots, dict]:
    spec = LoRAModelSpec(
        "tiny", 1, {"q_proj": (HIDDEN, HIDDEN)}, vocab_size=VOCAB, hidden_size=HIDDEN
    )
    slots = DeviceSlots(spec, SLOTS, MAX_RANK, device, torch.float32)
    heads = {}
    generator = torch.Generator().manual_seed(3)
    for slot, (rank, scale) in HEADS.items():
        a = torch.randn(rank, HIDDEN, generator=generator)
        b = torch.randn(VOCAB, rank, generator=generator)
        slots._write_head_lora(slot, VocabExtras(head_lora=(a, b, scale)))
        heads[slot] = (a, b, scale)
    # Slot 1 was written with an lm_head LoRA, then with an adapter without one: its rows
    # must be zero again (scale 0), whatever it held.
    slots._write_head_lora(
        1, VocabExtras(head_lora=(torch.ones(8, HIDDEN), torch.ones(VOCAB, 8), 3.0))
    )
    slots._write_head_lora(
        1, VocabExtras(token_ids=torch.tensor([3]), token_rows=torch.ones(1, HIDDEN))
    )
    return slots, heads


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_head_lora_of_every_slot_in_one_call_matches_per_row_reference(backend):
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    slots, heads = slots_with_heads(device)
    assert slots.vocab_slots == {0, 2, 5}
    slot_ids = torch.tensor([0, 2, -1, 1, 5, 3, 0, 2, 5, -1, 4, 2, 0], device=device)
    sampled = torch.tensor([0, 1, 2, 3, 4, 5, 8, 9, 10, 12], device=device)
    hidden = torch.randn(len(sampled), HIDDEN, device=device)
    logits = torch.randn(len(sampled), VOCAB, device=device)
    before = logits.clone()
    index = kernels.lora_index(slot_ids, SLOTS)
    batch = LoRABatch(weights=slots, slot_ids=slot_ids, index=index, rank=MAX_RANK)
    _add_head_lora(batch, sampled, hidden, logits, backend=backend)
    for row, token in enumerate(sampled.tolist()):
        slot = slot_ids[token].item()
        if slot not in heads:
            assert torch.equal(logits[row], before[row]), f"row {row} (slot {slot}) changed"
            continue
        a, b, scale = (t.double() if torch.is_tensor(t) else t for t in heads[slot])
        want = before[row].double().cpu() + scale * (hidden[row].double().cpu() @ a.T) @ b.T
        torch.testing.assert_close(logits[row].double().cpu(), want, rtol=1e-4, atol=1e-4)


def test_no_head_lora_leaves_logits_untouched():
    spec = LoRAModelSpec(
        "tiny", 1, {"q_proj": (HIDDEN, HIDDEN)}, vocab_size=VOCAB, hidden_size=HIDDEN
    )
    slots = DeviceSlots(spec, SLOTS, MAX_RANK, "cpu", torch.float32)
    slot_ids = torch.tensor([0, 1, -1])
    logits = torch.randn(3, VOCAB)
    before = logits.clone()
    batch = LoRABatch(weights=slots, slot_ids=slot_ids, index=None, rank=MAX_RANK)
    _add_head_lora(batch, torch.arange(3), torch.randn(3, HIDDEN), logits)
    assert slots.head_lora() is None and torch.equal(logits, before)


def test_rows_of_lm_head_lora_slots_run_eagerly_under_cuda_graphs():
    """A captured decode graph holds no per-slot lm_head LoRA: rows of a slot that has one
    (and no other vocabulary side) are run eagerly, the others may replay."""
    from types import SimpleNamespace

    from loragate.engine.runner.cuda_graphs import DecodeGraphs

    slots, _ = slots_with_heads("cpu")
    graphs = SimpleNamespace(adapter_slots=SimpleNamespace(slot_tensors=slots))

    def decodes(*lora_slots):
        return [SimpleNamespace(seq=SimpleNamespace(lora_slot=s)) for s in lora_slots]

    assert not slots.vocab_extras and not slots.extra_slots, "only lm_head LoRAs here"
    for slot in HEADS:
        assert DecodeGraphs._row_extras_in(graphs, decodes(-1, 3, slot))
    assert not DecodeGraphs._row_extras_in(graphs, decodes(-1, 1, 3, 4))

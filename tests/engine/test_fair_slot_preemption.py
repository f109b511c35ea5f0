"""Preemption for fairness when the adapter slots are what is full (issue 60): tenant A's two
long requests hold both device slots with adapters of their own while the batch has room
for more sequences and KV; tenant B's request, under a third adapter, waits for a slot.

Under `fair`, once A leads B by FAIR_MARGIN and A's sequences are past PROTECT_STEPS, the
sequence holding one slot is preempted and B's adapter takes that slot (every sequence
holding it is given up, so the slot frees); under `fcfs` B waits until one of A's requests
finished. Outputs are those of the run without preemption, and nothing is left behind.
Proved from the engine's steps, no clock.
"""

from __future__ import annotations

import pytest
from fair_share_testlib import Arrival, run
from test_fair_share import engine_for, greedy, prompt
from tiny_llama import ALL_MODULES, make_adapters

from loragate.adapters import LoRARequest
from loragate.engine.core.scheduler import PROTECT_STEPS
from loragate.plugins.builtin.fair_preemption import FAIR_MARGIN

LONG = 40
B_ARRIVES = PROTECT_STEPS + 2


@pytest.fixture(scope="module")
def slots_setup(tiny_model_dir, tmp_path_factory):
    model_dir = tiny_model_dir("llama")
    specs = {
        "a1": (8, list(ALL_MODULES), False),
        "a2": (8, ["q_proj", "v_proj"], False),
        "b": (8, ["q_proj", "o_proj"], False),
    }
    paths = make_adapters(model_dir, tmp_path_factory.mktemp("slot-adapters"), specs)
    loras = {name: LoRARequest(name, i + 1, str(p)) for i, (name, p) in enumerate(paths.items())}
    return str(model_dir), loras


def slots_full_of_a(loras) -> list[Arrival]:
    a = [
        Arrival(0, f"A{i}", prompt(i, 8), "A", loras[name], greedy(LONG))
        for i, name in enumerate(("a1", "a2"))
    ]
    return a + [Arrival(B_ARRIVES, "B0", prompt(50, 6), "B", loras["b"], greedy(6))]


@pytest.fixture(scope="module")
def slot_runs(slots_setup, make_llm):
    _, loras = slots_setup
    made = {}
    for policy in ("fcfs", "fair"):
        # Room for 8 sequences and plenty of KV: only the 2 adapter slots are full.
        engine = engine_for(slots_setup, make_llm, policy, max_num_seqs=8, max_loras=2)
        made[policy] = (engine, run(engine, slots_full_of_a(loras), greedy(LONG)))
    return made


def test_a_tenant_waiting_for_a_slot_gets_one_under_fair_and_waits_under_fcfs(slot_runs):
    engine, fair = slot_runs["fair"]
    # B's counter starts at the active minimum (A's): A leads it by FAIR_MARGIN after
    # FAIR_MARGIN / (2 x 2 decodes) steps of A's decodes, its sequences long past
    # PROTECT_STEPS; then one slot's sequence goes and B's adapter is copied into it.
    bound = int(FAIR_MARGIN // (2 * 2)) + 2
    assert fair.queue_steps("B0") <= bound, (fair.queue_steps("B0"), bound)
    assert engine.scheduler.num_fairness_preemptions == 1  # one slot's one sequence
    fcfs_engine, fcfs = slot_runs["fcfs"]
    assert fcfs.queue_steps("B0") >= LONG - B_ARRIVES
    assert fcfs_engine.scheduler.num_fairness_preemptions == 0
    # Never more than the three requests' sequences in a step: B waited on a slot alone.
    assert max(len(r.decode_seq_ids) + len(r.prefill_chunks) for r in engine.step_records) <= 3


def test_freeing_a_slot_changes_no_output_and_leaves_nothing_behind(slot_runs):
    _, fcfs = slot_runs["fcfs"]
    engine, fair = slot_runs["fair"]
    assert fair.outputs == fcfs.outputs and len(fair.outputs) == 3
    engine.check_integrity()
    assert engine.get_memory_stats()["allocated_blocks"] == 0
    assert engine.scheduler.busy_adapter_slots() == set()

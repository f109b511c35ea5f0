"""The persistent batch (engine/runner/input_batch.py) against a batch rebuilt from scratch.

Rows are written only where a sequence joins, grows a block, is preempted or leaves; every
step's inputs cut from them must equal what a rebuild from each sequence's own block table
gives (issue 36). Requests join and leave in random order (finishing, aborted, forked for
n > 1, preempted by recompute and by swap under a tight KV budget), and every step's
inputs are checked, row by row.
"""

from __future__ import annotations

import random

import torch

from loragate.engine import SamplingParams
from loragate.engine.core.sequence import Request, Sequence
from loragate.engine.runner.input_batch import InputBatch

BLOCK = 8


def rebuilt_inputs(scheduled, block_size: int) -> dict[str, torch.Tensor]:
    """The step's inputs as the runner built them from Python lists before the persistent
    batch: per token, from each sequence's own block table."""
    key = lambda item: item.seq.lora_slot if item.seq.lora_slot >= 0 else float("inf")  # noqa: E731
    prefills = sorted(scheduled.prefills, key=key)
    decodes = sorted(scheduled.decodes, key=key)
    ids, positions, slots, loras = [], [], [], []
    for item in prefills + decodes:
        seq, start = item.seq, item.seq.num_computed_tokens
        end = start + item.num_new_tokens
        ids += seq.token_ids[start:end]
        positions += range(start, end)
        table = seq.block_table
        slots += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
        loras += [seq.lora_slot] * item.num_new_tokens

    def tables(items):
        if not items:
            return None
        width = max(len(i.seq.block_table) for i in items)
        rows = [i.seq.block_table + [0] * (width - len(i.seq.block_table)) for i in items]
        return torch.tensor(rows, dtype=torch.int32)

    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "positions": torch.tensor(positions, dtype=torch.long),
        "slot_mapping": torch.tensor(slots, dtype=torch.long),
        "prefill_tables": tables(prefills),
        "decode_tables": tables(decodes),
        "lora": torch.tensor(loras, dtype=torch.long),
    }


def check_step(runner, scheduled, checked: list[int]):
    batch, sampled = original_prepare(runner, scheduled)
    want = rebuilt_inputs(scheduled, runner.block_size)
    assert torch.equal(batch.input_ids, want["input_ids"])
    assert torch.equal(batch.positions, want["positions"])
    assert torch.equal(batch.slot_mapping, want["slot_mapping"])
    for name, part in (("prefill_tables", batch.prefill), ("decode_tables", batch.decode)):
        if want[name] is None:
            assert part is None
        else:
            assert torch.equal(part.block_tables, want[name]), name
    if batch.lora is not None:
        assert torch.equal(batch.lora.slot_ids, want["lora"])
    # Every row of the persistent batch holds its sequence's table and nothing else.
    table = runner.input_batch
    live = {s.seq_id: s for s in runner_live(runner)}
    assert set(table.row_of) == {i for i, s in live.items() if s.block_table}
    for seq_id, row in table.row_of.items():
        blocks = live[seq_id].block_table
        expected = blocks + [0] * (table.max_blocks_per_seq - len(blocks))
        assert table.block_tables[row].tolist() == expected, seq_id
    free = set(range(table.num_rows)) - set(table.row_of.values())
    for row in free:
        assert not table.block_tables[row].any(), f"row {row} left stale"
    checked[0] += 1
    return batch, sampled


RUNNER_LIVE = {}


def runner_live(runner):
    return RUNNER_LIVE[id(runner)]()


def original_prepare(runner, scheduled):
    return type(runner).prepare(runner, scheduled)


def test_200_joins_and_leaves_in_random_order_match_a_rebuilt_batch(tiny_model_dir, make_llm):
    llm = make_llm(
        model=str(tiny_model_dir("llama")),
        dtype="float32",
        max_model_len=128,
        max_num_seqs=8,  # forks of n > 1 outnumber it: the batch grows its rows
        block_size=BLOCK,
        num_kv_blocks=24,  # tight: preemptions by recompute and swap
        preemption_mode="swap",
        swap_space=0.00003,  # room for a few swapped sequences: the others recompute
        enable_prefix_caching=True,
        max_num_batched_tokens=24,
    )
    engine = llm.llm_engine
    runner = engine.runner
    RUNNER_LIVE[id(runner)] = engine.scheduler.live_sequences
    checked = [0]
    runner.prepare = lambda scheduled: check_step(runner, scheduled, checked)
    rng = random.Random(7)
    joined = left = 0
    next_id = 0
    live: list[str] = []
    shared = [rng.randrange(100, 40000) for _ in range(12)]  # a prefix some prompts share
    while joined < 200 or engine.has_unfinished_requests():
        if joined < 200 and rng.random() < 0.6:
            prompt = (shared if rng.random() < 0.3 else []) + [
                rng.randrange(100, 40000) for _ in range(rng.randint(1, 20))
            ]
            n = rng.choice([1, 1, 1, 2, 3])
            params = SamplingParams(
                temperature=0 if n == 1 else 0.8,
                n=n,
                seed=next_id,
                max_tokens=rng.randint(1, 30),
                ignore_eos=True,
            )
            request_id = f"r{next_id}"
            engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            live.append(request_id)
            next_id += 1
            joined += 1
        if live and rng.random() < 0.1:
            victim = live.pop(rng.randrange(len(live)))
            left += engine.abort_request(victim)
        for out in engine.step():
            if out.finished:
                left += 1
                if out.request_id in live:
                    live.remove(out.request_id)
    assert joined == 200 and left == 200
    assert engine.scheduler.num_preemptions > 0, "no preemption: the KV budget is too loose"
    swapper = engine.swapper
    assert swapper.num_swap_ins > 0, "no swap-in"
    assert engine.scheduler.num_preemptions > swapper.num_swap_outs, "no recompute"
    assert checked[0] > 100
    assert engine.runner.input_batch.num_rows > 8, "n > 1 forks never grew the batch"
    # The last frees are synced by the next step's prepare: every row is then given back.
    engine.runner.input_batch.sync(engine.block_manager.take_changed_tables())
    assert engine.runner.input_batch.row_of == {}
    assert not engine.runner.input_batch.block_tables.any()


def test_rows_are_reused_and_cleared():
    batch = InputBatch(max_rows=2, max_blocks_per_seq=6)
    request = Request("r", None, [1, 2, 3], SamplingParams())
    a, b, c = (Sequence(i, request, 0, None) for i in range(3))
    a.block_table, b.block_table = [5, 6, 7], [9]
    batch.sync({0: a, 1: b})
    assert batch.tables([b, a]).tolist() == [[9, 0, 0], [5, 6, 7]]
    a.block_table = []  # a leaves: its row is cleared and handed to c
    c.block_table = [4]
    batch.sync({0: a, 2: c})
    assert batch.row_of == {1: 1, 2: 0}
    assert batch.block_tables[0].tolist() == [4, 0, 0, 0, 0, 0]
    b.block_table = [9, 10]  # b grows a block
    a.block_table = [1, 2, 3, 4]  # a comes back (a swap-in): the batch grows a row
    batch.sync({1: b, 0: a})
    assert batch.num_rows == 4 and batch.tables([a, b, c]).tolist() == [
        [1, 2, 3, 4],
        [9, 10, 0, 0],
        [4, 0, 0, 0],
    ]

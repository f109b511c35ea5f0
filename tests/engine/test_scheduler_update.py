"""The scheduler on its own (issue 58): `schedule()` says what runs and changes no count of
computed tokens except a prefix-cache hit it applies; `update_from_output()` is where what
the step computed, sampled and stopped is written. No model: the runner's output is made
by hand."""

from __future__ import annotations

from loragate.engine.core.block_manager import BlockManager
from loragate.engine.core.scheduler import Scheduler
from loragate.engine.core.sequence import Request, Sequence, SequenceStatus
from loragate.engine.runner.model_runner import ModelRunnerOutput
from loragate.engine.sampling.sampler import SampleResult
from loragate.engine.sampling.sampling_params import SamplingParams

BLOCK = 4


def make_scheduler(enable_prefix_caching: bool = False) -> Scheduler:
    blocks = BlockManager(32, BLOCK, watermark=0, enable_prefix_caching=enable_prefix_caching)
    return Scheduler(blocks, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64)


def add(scheduler: Scheduler, request_id: str, prompt: list[int], n: int = 1) -> Request:
    params = SamplingParams(temperature=0, n=n, max_tokens=8, ignore_eos=True)
    request = Request(request_id, None, prompt, params)
    request.seqs = [Sequence(hash((request_id, i)) % 10_000, request, i, None) for i in range(n)]
    scheduler.add(request.seqs[0])
    request.pending_forks = request.seqs[1:]
    return request


def run(out, token: int = 7) -> ModelRunnerOutput:
    """The runner's output for `out`: every sampling sequence (forks after their parent)
    takes `token`."""
    forks = {}
    for item in out.forks:
        forks.setdefault(item.parent.seq_id, []).append(item.seq)
    sampled = []
    for item in out.prefills + out.decodes:
        if item.samples:
            sampled += [item.seq, *forks.get(item.seq.seq_id, [])]
    return ModelRunnerOutput(sampled, [SampleResult(token, -0.5) for _ in sampled])


def test_computed_tokens_advance_in_update_from_output_not_in_schedule():
    scheduler = make_scheduler()
    request = add(scheduler, "r", list(range(10)))
    seq = request.seqs[0]
    out = scheduler.schedule()
    assert [(item.seq, item.num_new_tokens) for item in out.prefills] == [(seq, 10)]
    assert seq.num_computed_tokens == 0 and seq.output_token_ids == []
    assert scheduler.update_from_output(out, run(out)) == [request]
    assert seq.num_computed_tokens == 10 and seq.output_token_ids == [7]
    assert [r.token_id for r in seq.unreported] == [7]
    out = scheduler.schedule()
    assert [(item.seq, item.num_new_tokens) for item in out.decodes] == [(seq, 1)]
    scheduler.update_from_output(out, run(out, token=9))
    assert seq.num_computed_tokens == 11 and seq.output_token_ids == [7, 9]


def test_a_prefix_hit_counts_as_computed_when_the_scheduler_admits_it():
    scheduler = make_scheduler(enable_prefix_caching=True)
    first = add(scheduler, "a", list(range(10))).seqs[0]
    out = scheduler.schedule()
    scheduler.update_from_output(out, run(out))  # blocks 0 and 1 are full and named
    second = add(scheduler, "b", list(range(10))).seqs[0]
    out = scheduler.schedule()
    assert [(item.seq, item.num_new_tokens) for item in out.prefills] == [(second, 2)]
    assert second.block_table[:2] == first.block_table[:2]
    assert second.num_computed_tokens == 8  # the hit's tokens: the scheduler applied it
    scheduler.update_from_output(out, run(out))
    assert second.num_computed_tokens == 10 and second.output_token_ids == [7]
    scheduler.block_manager.check_integrity(scheduler.live_sequences())


def test_forks_join_when_the_prompt_runs_and_share_its_blocks():
    scheduler = make_scheduler()
    request = add(scheduler, "n3", list(range(6)), n=3)
    parent, *children = request.seqs
    out = scheduler.schedule()
    assert [item.seq for item in out.forks] == children
    assert all(item.parent is parent and item.num_new_tokens == 6 for item in out.forks)
    assert scheduler.running == [parent, *children] and request.pending_forks == []
    for child in children:
        assert child.block_table == parent.block_table and child.num_computed_tokens == 0
    assert set(out.changed_tables) == {s.seq_id for s in request.seqs}
    scheduler.update_from_output(out, run(out))
    for seq in request.seqs:
        assert seq.num_computed_tokens == 6 and seq.output_token_ids == [7]
    scheduler.block_manager.check_integrity(scheduler.live_sequences())


def test_a_stop_keeps_the_tokens_its_output_kept_and_frees_the_blocks():
    scheduler = make_scheduler()
    request = add(scheduler, "s", list(range(5)))
    seq = request.seqs[0]
    for token in (11, 12, 13):
        out = scheduler.schedule()
        scheduler.update_from_output(out, run(out, token))
    assert seq.output_token_ids == [11, 12, 13]
    scheduler.stop(seq, 1, "stop", "twelve")
    assert seq.output_token_ids == [11] and seq.num_tokens == 6
    assert seq.status is SequenceStatus.FINISHED and seq.finish_reason == "stop"
    assert seq.stop_reason == "twelve" and seq.block_table == []
    assert scheduler.running == [] and scheduler.block_manager.num_free_blocks == 32
    out = scheduler.schedule()
    assert out.empty and list(out.changed_tables) == [seq.seq_id]  # its row goes back


def test_a_failed_sample_fails_its_request_alone():
    scheduler = make_scheduler()
    ok, bad = add(scheduler, "ok", [1, 2, 3]), add(scheduler, "bad", [4, 5, 6])
    out = scheduler.schedule()
    result = run(out)
    result.samples[1] = RuntimeError("boom")
    assert scheduler.update_from_output(out, result) == [ok, bad]
    assert bad.finished and bad.error is not None and bad.seqs[0].output_token_ids == []
    assert not ok.finished and ok.seqs[0].output_token_ids == [7]
    assert scheduler.running == [ok.seqs[0]]

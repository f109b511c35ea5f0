"""Each step record says where the step's time went (benchmarks/overhead.py prints it):
schedule, prepare, forward, sample and output, which together make up the step."""

from __future__ import annotations

from loragate.engine import SamplingParams

PHASES = ["schedule", "prepare", "forward", "sample", "output"]


def test_every_step_records_its_phases(tiny_model_dir, make_llm):
    llm = make_llm(model=str(tiny_model_dir("llama")), dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [1, 5, 9, 200 + i]} for i in range(4)], params)
    records = list(llm.llm_engine.step_records)
    assert len(records) == 6  # one prefill step, then five decode steps
    for record in records:
        phases = dict(record.phases)
        assert list(phases) == PHASES, record
        assert all(ms >= 0 for ms in phases.values()), record
        assert sum(phases.values()) <= record.ms + 0.5, record
        assert phases["forward"] > 0, record

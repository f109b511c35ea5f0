"""The step that brings an adapter into a slot, on the CPU: borrowed in place against copied.

Eight base-model streams decode on the default model (SmolLM2-135M) while requests for
rank-64 adapters on all seven projections join one at a time, each adapter already in the
CPU tier (preloaded), so the step that admits a request pays for its slot and its 7-token
prompt and nothing else. Two engines in one process, one whose slots borrow the CPU tier's
rows (the default on a CPU, adapters/slots.py) and one whose slots copy them in (as a GPU's
do), take turns round by round, so a loaded machine slows both alike. From the step records:
the join step's time and its schedule phase (where a slot is filled), each against the
median decode step of the same engine around it.

    .venv/bin/python benchmarks/adapter_join.py --rounds 4 --dtype float32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from unittest import mock

from harness import (
    STREAMS,
    add_dtype,
    in_turns,
    lora_engine,
    machine_line,
    print_table,
    random_adapters,
    start_streams,
    stop_streams,
)

from loragate.adapters import LoRARequest
from loragate.adapters.device_tier import DeviceTier
from loragate.engine import LLM, SamplingParams

JOINS = 4  # adapters per round, one joining at a time


def make_engine(dtype: str, borrow: bool) -> LLM:
    real = DeviceTier.__init__

    def tier(self, spec, max_loras, max_rank, device, dtype, _borrow=True):
        real(self, spec, max_loras, max_rank, device, dtype, borrow=borrow)

    with mock.patch.object(DeviceTier, "__init__", tier):
        return lora_engine(dtype, 64, JOINS, 2 * JOINS)


def one_round(llm: LLM, loras: list[LoRARequest], tag: str) -> list[tuple[float, float, float]]:
    """(join step ms, its schedule ms, median decode ms around it) for each join."""
    engine = llm.llm_engine
    streams = start_streams(engine, tag, max_tokens=400)
    for _ in range(6):
        engine.step_tokens()
    for lora in loras:
        engine.residency.preload(lora)
    joins = []
    for i, lora in enumerate(loras):
        prompt = engine.encode(f"Name a color. ({tag} {i})")
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        engine.add_request(f"{tag}-c{i}", {"prompt_token_ids": prompt}, params, lora_request=lora)
        engine.step_tokens()
        join = engine.step_records[-1]
        assert join.prefill_tokens > 0, "the joining request runs in the step that admits it"
        after = []
        for _ in range(5):
            engine.step_tokens()
            after.append(engine.step_records[-1].ms)
        phases = dict(join.phases)
        joins.append((join.ms, phases.get("schedule", 0.0), statistics.median(after)))
    stop_streams(engine, streams)
    for lora in loras:
        engine.residency.remove(lora)
    return joins


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    add_dtype(ap, "float32")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as root:
        paths = random_adapters(Path(root), JOINS * args.rounds)

        def arm(name: str, borrow: bool):
            llm = make_engine(args.dtype, borrow)

            def one(r: int) -> list:
                ids = range(r * JOINS, (r + 1) * JOINS)
                loras = [LoRARequest(f"{name}-{i}", 1 + i, str(paths[i])) for i in ids]
                return one_round(llm, loras, f"{name}{r}")

            return one

        results = in_turns(
            args.rounds, {"borrowed": arm("borrowed", True), "copied": arm("copied", False)}
        )

    print(machine_line())
    print(f"# dtype {args.dtype}, {args.rounds} rounds of {JOINS} joins beside {STREAMS} streams")
    rows = []
    for name, rounds in results.items():
        joins = [j for one in rounds for j in one]
        join = statistics.median(j for j, _, _ in joins)
        schedule = statistics.median(s for _, s, _ in joins)
        decode = statistics.median(d for _, _, d in joins)
        rows.append(
            [name, f"{join:.1f}", f"{schedule:.1f}", f"{decode:.1f}", f"{join / decode:.2f}"]
        )
    header = ["slots", "join step ms", "its schedule ms", "decode step ms", "join / decode"]
    print_table(header, rows)


if __name__ == "__main__":
    main()

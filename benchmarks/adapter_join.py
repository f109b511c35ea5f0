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

from transformers import AutoModelForCausalLM

from loragate.adapters import LoRARequest
from loragate.adapters.device_tier import DeviceTier
from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.model_loader import resolve_model
from loragate.tools import make_random_adapter

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STREAMS = 8
JOINS = 4  # adapters per round, one joining at a time


def make_engine(dtype: str, borrow: bool) -> LLM:
    real = DeviceTier.__init__

    def tier(self, spec, max_loras, max_rank, device, dtype, _borrow=True):
        real(self, spec, max_loras, max_rank, device, dtype, borrow=borrow)

    with mock.patch.object(DeviceTier, "__init__", tier):
        return LLM(
            dtype=dtype,
            max_model_len=2048,
            max_num_seqs=16,
            kv_cache_memory_gb=1.0,
            enable_lora=True,
            max_loras=JOINS,
            max_cpu_loras=2 * JOINS,
            max_lora_rank=64,
        )


def one_round(llm: LLM, loras: list[LoRARequest], tag: str) -> list[tuple[float, float, float]]:
    """(join step ms, its schedule ms, median decode ms around it) for each join."""
    engine = llm.llm_engine
    encode = engine.encode
    stream = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
    for i in range(STREAMS):
        prompt = encode(f"Tell me a short story about a lighthouse keeper. ({tag} {i})")
        engine.add_request(f"{tag}-b{i}", {"prompt_token_ids": prompt}, stream)
    for _ in range(6):
        engine.step_tokens()
    for lora in loras:
        engine.residency.cache.preload(lora)
    joins = []
    for i, lora in enumerate(loras):
        prompt = encode(f"Name a color. ({tag} {i})")
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
    for request_id in [f"{tag}-b{i}" for i in range(STREAMS)]:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step_tokens()
    for lora in loras:
        engine.residency.cache.remove(lora)
    return joins


def random_adapters(root: Path, count: int, rank: int = 64) -> list[Path]:
    """`count` random adapters of `rank` on all seven projections of the default model."""
    base = AutoModelForCausalLM.from_pretrained(resolve_model(None).hf_dir)
    return [
        make_random_adapter(base, root / f"a{i}", rank=rank, targets=TARGETS, seed=i)
        for i in range(count)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as root:
        paths = random_adapters(Path(root), JOINS * args.rounds)
        engines = {
            "borrowed": make_engine(args.dtype, True),
            "copied": make_engine(args.dtype, False),
        }
        results: dict[str, list] = {name: [] for name in engines}
        for r in range(args.rounds):
            for name, llm in engines.items():
                loras = [
                    LoRARequest(f"{name}-{r}-{i}", 1 + r * JOINS + i, str(paths[r * JOINS + i]))
                    for i in range(JOINS)
                ]
                results[name] += one_round(llm, loras, f"{name}{r}")

    print(f"dtype {args.dtype}, {args.rounds} rounds of {JOINS} joins beside {STREAMS} streams")
    print("| slots | join step ms | its schedule ms | decode step ms | join / decode |")
    print("|---|---|---|---|---|")
    for name, joins in results.items():
        join = statistics.median(j for j, _, _ in joins)
        schedule = statistics.median(s for _, s, _ in joins)
        decode = statistics.median(d for _, _, d in joins)
        print(f"| {name} | {join:.1f} | {schedule:.1f} | {decode:.1f} | {join / decode:.2f} |")


if __name__ == "__main__":
    main()

"""Every file in examples/seed/ (the seed tutorial's examples, only the import and model
changed) runs with the default model and prints a result.

Each runs in its own subprocess with LORAGATE_EXAMPLE_MAX_TOKENS=8, two at a time, each
on one thread (OMP_NUM_THREADS=1): two torch processes of two threads each on two cores
spin against each other and run several times slower.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loragate.tools import make_random_adapter

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "seed"
FILES = sorted(p.name for p in EXAMPLES.glob("*.py"))
# Lines the examples print besides generated text.
NOT_GENERATED = ("as expected:", "{", "during:", "after:")


def run_example(name: str, adapter: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        LORAGATE_EXAMPLE_MAX_TOKENS="8",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), str(adapter)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def example_runs(hf_default_model, tmp_path_factory):
    """name -> finished process; the LoRA example gets a small random adapter."""
    adapter = make_random_adapter(
        hf_default_model,
        tmp_path_factory.mktemp("seed") / "math_lora",
        rank=4,
        targets=["q_proj", "v_proj"],
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = pool.map(lambda name: run_example(name, adapter), FILES)
        return dict(zip(FILES, runs, strict=True))


def test_every_seed_example_has_a_file():
    assert FILES == [
        "01_basic_usage.py",
        "02_advanced_config.py",
        "03_streaming.py",
        "04_memory_stats.py",
        "05_beam_search.py",
        "06_beam_search_with_sharing.py",
        "07_multi_lora.py",
        "08_batch_config.py",
    ]


@pytest.mark.parametrize("name", FILES)
def test_seed_example_runs_and_prints_a_result(example_runs, name):
    run = example_runs[name]
    assert run.returncode == 0, f"{name} failed:\n{run.stderr[-3000:]}"
    generated = [line for line in run.stdout.splitlines() if not line.startswith(NOT_GENERATED)]
    if name != "04_memory_stats.py":  # it prints only the stats
        assert "".join(generated).strip(), f"{name} printed no text:\n{run.stdout}"


def test_advanced_config_example_shows_the_tensor_parallel_refusal(example_runs):
    out = example_runs["02_advanced_config.py"].stdout
    assert "as expected: tensor_parallel_size=4: tensor parallelism is not supported" in out


def test_seed_get_memory_stats_adds_up_during_and_after_a_run(example_runs):
    """The seed's get_memory_stats, unchanged, over llm.llm_engine: allocated + free =
    total at every step and after; blocks are in use during the run, none after it."""
    lines = example_runs["04_memory_stats.py"].stdout.splitlines()
    during = [ast.literal_eval(line.removeprefix("during: ")) for line in lines[:-1]]
    after = ast.literal_eval(lines[-1].removeprefix("after: "))
    assert during and lines[-1].startswith("after: ")
    for stats in during + [after]:
        assert stats["allocated_blocks"] + stats["free_blocks"] == stats["total_blocks"]
        assert stats["utilization"] == stats["allocated_blocks"] / stats["total_blocks"]
    assert max(s["allocated_blocks"] for s in during) > 0
    assert after["allocated_blocks"] == 0 and after["total_blocks"] > 0

"""What one GPU machine call runs for issue 18, in order, each step under its own cap, all
under one budget: the call's 10 minutes, less a rerun's worth of the session's 15.

On CUDA: the two random Llamas (the default model's shapes, and a 1B-class one), the
gpu-marked tests, benchmarks/kernels.py, benchmarks/gpu_step.py (the decode step with and
without CUDA graphs, its profile and a slot copy's cost), then throughput.py and
multi_lora.py on both models.
With `default_model=True` (its GGUF joined from a few calls' parts) the default model itself
takes the 135M stand-in's place: in the tests (no stand-in tokenizer, so the tests of the
default model run) and, on CUDA, in the benchmarks (steps named `-default`). With
`cpu=True` the same steps run at tiny sizes on the CPU, to check the wiring here (the
default model's benchmarks there would outrun their caps).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Below this many seconds a step could not finish anything useful: it is not started.
MIN_STEP_S = 15
# Kept back from every step's timeout for the driver's own bookkeeping and the summary.
RESERVE_S = 10
GPU_MARK = re.compile(r"pytest\.mark\.gpu\b")


@dataclass(frozen=True)
class Step:
    """One command: `log` names its file in $OUT; it runs only once the steps in `needs`
    passed, and is taken as done when `done_if` exists (a model left by an earlier call)."""

    name: str
    argv: list[str]
    cap_s: int
    log: str
    needs: tuple[str, ...] = ()
    done_if: Path | None = None
    env: dict[str, str] = field(default_factory=dict)


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """Every test file that marks a test `gpu`, relative to the checkout."""
    return sorted(
        str(path.relative_to(root))
        for path in (root / "tests").rglob("test_*.py")
        if GPU_MARK.search(path.read_text())
    )


def step_timeout(cap_s: float, left_s: float) -> float | None:
    """The step's timeout inside what is left of the budget; None when too little is left."""
    timeout = min(cap_s, left_s - RESERVE_S)
    return timeout if timeout >= MIN_STEP_S else None


def plan(
    work: Path, out: Path, tokenizer: Path, cpu: bool = False, default_model: bool = False
) -> list[Step]:
    """The steps of one call, most wanted first: the tests (issue 18, items 1-2), the
    kernels (item 3), then the engine benchmarks (item 4). `work` holds the models, `out`
    is $OUT; `default_model`: the default model is installed, so nothing stands in for it."""
    py = sys.executable
    bench = ROOT / "benchmarks"
    steps = [
        Step(
            "pytest",
            [py, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider"]
            + ["--timeout", "170", *gpu_test_files()],
            cap_s=180,
            log="pytest.log",
            env={} if default_model else {"LORAGATE_TEST_TOKENIZER_DIR": str(tokenizer)},
        ),
        Step(
            "kernels",
            [py, str(bench / "kernels.py")] + (["--ops", "write_kv"] if cpu else []),
            cap_s=90,
            log="kernels.log",
        ),
    ]
    # None: the default model itself (the benchmarks' default `--model`), nothing to build.
    models: dict[str, Path | None] = {"135m": work / "models" / "llama-135m"}
    if default_model and not cpu:
        models = {"default": None}
    models["1b"] = work / "models" / "llama-1b"
    for size, path in models.items():
        if path is None:
            continue
        steps.append(
            Step(
                f"model-{size}",
                [py, str(bench / "random_llama.py"), "--size", "tiny" if cpu else size]
                + ["--out", str(path), "--tokenizer-dir", str(tokenizer)],
                cap_s=120,  # the 1B took over 60 s on the H200 machine's CPUs
                log="setup.log",
                done_if=path / "tokenizer.json",  # copied once the weights are saved
            )
        )
    device = ["--device", "cpu", "--dtype", "float32"] if cpu else ["--device", "cuda"]
    # On CUDA a fixed KV cache (64 sequences of 1024 tokens of the 1B model fill 2 GB), not
    # what gpu_memory_utilization leaves: quicker to allocate, and the same for every engine
    # a benchmark builds in turn.
    dtype = [] if cpu else ["--dtype", "bfloat16", "--kv-cache-memory-gb", "4"]
    load = ["--num-requests", str(4 if cpu else 64), "--max-num-seqs", str(4 if cpu else 64)]
    model = {size: [] if path is None else ["--model", str(path)] for size, path in models.items()}
    needs = {size: () if path is None else (f"model-{size}",) for size, path in models.items()}
    # The decode step with and without graphs, a profile of it, and a slot copy's cost.
    step_load = ["--num-seqs", "4", "--tokens", "8"] if cpu else []
    for size in models:
        steps.append(
            Step(
                f"step-{size}",
                [py, str(bench / "gpu_step.py"), *model[size], *device, *dtype, *step_load],
                cap_s=90,
                log="throughput.log",
                needs=needs[size],
            )
        )
    for size in models:
        for eager in ([], ["--enforce-eager"]):
            steps.append(
                Step(
                    f"throughput-{size}" + ("-eager" if eager else ""),
                    [py, str(bench / "throughput.py"), *model[size], *device, *dtype]
                    + [*load, "--skip-hf", *eager],
                    cap_s=45,
                    log="throughput.log",
                    needs=needs[size],
                )
            )
    # LoRA's cost against base-only at 1, 16 and 64 adapters (item 4).
    sweep = ["--adapters", "2", "--sweep", "1,2", "--max-output-len", "8"]
    if not cpu:
        sweep = ["--adapters", "16", "--sweep", "1,16,64"]
    for size in models:
        steps.append(
            Step(
                f"multi_lora-{size}",
                [py, str(bench / "multi_lora.py"), *model[size], *device, *dtype]
                + [*load, *sweep, "--skip-peft", "--plot", str(out / f"multi_lora_{size}.png")],
                cap_s=90,
                log="multi_lora.log",
                needs=needs[size],
            )
        )
    return steps

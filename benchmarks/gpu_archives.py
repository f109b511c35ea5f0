"""The xz archives a GPU machine's call carries in `.gpu_assets/` (benchmarks/gpu_assets.py
makes them here, gpu_check.py unpacks them there), with nothing but the standard library:
on the device they are unpacked before anything else is importable.

`wheels.tar.xz` holds the wheels `make gpu-wheels` downloads, each rewritten with its
members stored rather than deflated, so that xz compresses across every wheel's files
(19.5 MiB of wheels become 7.8 MiB) and pip installs them as it would the originals;
`tokenizer.tar.xz` the default model's tokenizer files (3.4 MiB, 0.4 packed).
"""

from __future__ import annotations

import io
import lzma
import shutil
import tarfile
import zipfile
from pathlib import Path

WHEELS_ARCHIVE = "wheels.tar.xz"
TOKENIZER_ARCHIVE = "tokenizer.tar.xz"
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def stored_wheel(wheel: Path) -> bytes:
    """`wheel` rewritten with its members stored, not deflated: the same files, names and
    RECORD, which pip installs alike."""
    sink = io.BytesIO()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as out:
        for info in source.infolist():
            data = source.read(info)  # read under the member's own compression
            info.compress_type = zipfile.ZIP_STORED
            out.writestr(info, data)
    return sink.getvalue()


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def pack_wheels(wheels: Path, archive: Path) -> list[str]:
    """Every `*.whl` in `wheels`, stored, into the xz tar `archive`; return their names."""
    names = sorted(w.name for w in wheels.glob("*.whl"))
    if not names:
        raise FileNotFoundError(f"no wheels in {wheels}: run `make gpu-wheels` first")
    with tarfile.open(archive, "w:xz", preset=XZ_PRESET) as tar:
        for name in names:
            _add_bytes(tar, name, stored_wheel(wheels / name))
    return names


def pack_files(source: Path, names: list[str], archive: Path) -> list[str]:
    """The files `names` in `source` (those there) into the xz tar `archive`; return them."""
    present = [name for name in names if (source / name).is_file()]
    with tarfile.open(archive, "w:xz", preset=XZ_PRESET) as tar:
        for name in present:
            tar.add(source / name, arcname=name)
    return present


def unpack(archive: Path, target: Path) -> Path:
    """`archive` (an xz tar made here) unpacked into a fresh `target`; return `target`."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(target, filter="data")
    return target

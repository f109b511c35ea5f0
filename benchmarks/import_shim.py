"""Make `loragate` importable from a checkout without installing it: a folder `loragate/`
of symbolic links, one per top-level package in pyproject's [tool.setuptools.package-dir],
to put on PYTHONPATH. The GPU machine has no network and no time to spare for a pip install
of the project; the checkout's own folders are what runs.

    python3 benchmarks/import_shim.py /tmp/shim
    PYTHONPATH=/tmp/shim python3 -c 'import loragate.engine'
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_links(root: Path = ROOT) -> dict[str, Path]:
    """Each top-level subpackage of `loragate` and its folder in the checkout. A nested
    package's folder must lie where its parent's link leads, or the shim would miss it."""
    folders = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    links: dict[str, Path] = {}
    for package, folder in sorted(folders.items()):
        parts = package.split(".")
        if parts[0] != "loragate" or len(parts) < 2:
            raise ValueError(f"package-dir entry outside loragate.*: {package!r}")
        if len(parts) == 2:
            links[parts[1]] = root / folder
            continue
        parent = links.get(parts[1])
        if parent is None or (root / folder) != parent.joinpath(*parts[2:]):
            raise ValueError(f"{package!r} -> {folder!r} is not inside its parent's folder")
    return links


def build_shim(target: Path, root: Path = ROOT) -> Path:
    """Write `target/loragate/<name>` links (replacing a shim already there); return the
    folder to put on PYTHONPATH."""
    package = target / "loragate"
    package.mkdir(parents=True, exist_ok=True)
    for old in package.iterdir():
        if old.is_symlink():
            old.unlink()
    for name, folder in package_links(root).items():
        (package / name).symlink_to(folder, target_is_directory=True)
    return target


if __name__ == "__main__":
    print(build_shim(Path(sys.argv[1]).resolve()))

"""Where a client may point the server at adapter weights: only inside --adapter-root.

A path is resolved (every symlink followed, `..` collapsed) before it is compared with the
root, so neither `../` nor a symlink planted inside the root can reach other files. The
resolved path is what the engine loads, so a symlink swapped later changes nothing.
"""

from __future__ import annotations

from pathlib import Path


class AdapterPathError(ValueError):
    """The path is outside the adapter root, missing, or not a directory."""


def resolve_adapter_dir(root: Path | None, path: str) -> Path:
    """The real directory `path` names, refusing anything that is not under `root`."""
    if root is None:
        raise AdapterPathError(
            "adapter registration is disabled: start the server with --adapter-root DIR"
        )
    if not isinstance(path, str) or not path.strip():
        raise AdapterPathError("path must be a non-empty directory path under the adapter root")
    if "\x00" in path:
        raise AdapterPathError("path must not contain NUL characters")
    real_root = root.resolve()
    candidate = Path(path).expanduser()
    if not candidate.is_absolute():
        candidate = real_root / candidate
    try:
        resolved = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable components
        raise AdapterPathError(f"path {path!r} cannot be resolved: {exc}") from exc
    if resolved == real_root or not resolved.is_relative_to(real_root):
        raise AdapterPathError(
            f"path {path!r} resolves outside the adapter root; adapters must live under it"
        )
    if not resolved.is_dir():
        raise AdapterPathError(f"path {path!r} is not a directory under the adapter root")
    return resolved


def relative_to_root(root: Path | None, path: Path) -> str:
    """How an adapter's location is shown to clients: never the server's absolute path."""
    if root is not None and path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return path.name

"""Where a client may point the server at adapter weights: only inside --adapter-root.

A path is resolved (every symlink followed, `..` collapsed) before it is compared with the
root, so neither `../` nor a symlink planted inside the root can reach other files. The
resolved path is what the engine loads, so a symlink swapped later changes nothing.

Errors show the path as the client sent it (relative paths) or relative to the root,
never the server's absolute root, and never more than a short prefix of it. Paths longer
than `MAX_PATH_CHARS`, or with a component longer than `MAX_COMPONENT_CHARS` (the limits
of common Linux file systems), are refused before the file system sees them.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

MAX_PATH_CHARS = 1024
MAX_COMPONENT_CHARS = 255


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
    _check_lengths(path)
    real_root = root.resolve()
    shown = _shown(path, real_root, root)
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = real_root / candidate
    try:
        resolved = candidate.resolve(strict=False)
        is_dir = resolved.is_dir()
    except (OSError, RuntimeError) as exc:  # symlink loops, unreadable components
        reason = getattr(exc, "strerror", None) or "a symlink loop"
        raise AdapterPathError(f"path {shown} cannot be resolved ({reason})") from exc
    if resolved == real_root or not resolved.is_relative_to(real_root):
        raise AdapterPathError(
            f"path {shown} resolves outside the adapter root; adapters must live under it"
        )
    if not is_dir:
        raise AdapterPathError(f"path {shown} is not a directory under the adapter root")
    return resolved


def _check_lengths(path: str) -> None:
    if len(path) > MAX_PATH_CHARS:
        raise AdapterPathError(
            f"path is {len(path)} characters long; at most {MAX_PATH_CHARS} are accepted"
        )
    longest = max((len(part) for part in PurePosixPath(path).parts), default=0)
    if longest > MAX_COMPONENT_CHARS:
        raise AdapterPathError(
            f"path has a component of {longest} characters; at most {MAX_COMPONENT_CHARS} "
            "are accepted"
        )


def _shown(path: str, *roots: Path) -> str:
    """The client's path for an error message: relative to the root when it is under it,
    '<adapter-root>' for the root itself, and cut short."""
    text = path
    for root in roots:
        for prefix in {str(root), root.as_posix()}:
            if text == prefix or text.startswith(prefix.rstrip("/") + "/"):
                text = "<adapter-root>" + text[len(prefix.rstrip("/")) :]
    if text.startswith("/") or text.startswith("~"):
        text = "<absolute path>"  # outside the root: say nothing about the server's layout
    return repr(text if len(text) <= 120 else text[:120] + "...")


def relative_to_root(root: Path | None, path: Path) -> str:
    """How an adapter's location is shown to clients: never the server's absolute path."""
    if root is not None and path.is_relative_to(root):
        return path.relative_to(root).as_posix()
    return path.name


def hide_root(text: str, root: Path | None) -> str:
    """Error text with the server's adapter root replaced, so no absolute path leaks."""
    if root is None:
        return text
    return text.replace(str(root), "<adapter-root>")

"""Builds a kernels/*.c file into a shared library with the system C compiler, once per machine.

The library goes to ``~/.cache/loragate/kernels`` (``LORAGATE_CACHE`` moves it, as it moves
the converted models), keyed by the source (with the headers beside it), the flags and the
CPU (``-march=native`` code runs only on CPUs like the one that built it). No torch headers
are needed, so a build takes about a second. Callers turn a failed build into a fallback to
their torch path and say why.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
LOAD_ERRORS = (OSError, subprocess.SubprocessError, AttributeError)


def build(source: Path, defines: tuple[str, ...] = ()) -> Path:
    """The compiled library of ``source``, building it when this machine has none yet;
    ``defines``: preprocessor names to define (a variant, such as the tiles' emulation)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler found (set CC)")
    # The shared headers beside the source are part of what is built.
    text = b"".join(p.read_bytes() for p in (source, *sorted(source.parent.glob("*.h"))))
    flags = (*FLAGS, *(f"-D{name}" for name in defines))
    key = hashlib.sha256(text + " ".join((compiler, *flags, cpu_id())).encode()).hexdigest()
    cache = Path(os.environ.get("LORAGATE_CACHE") or "~/.cache/loragate").expanduser()
    target = cache / "kernels" / f"{source.stem}-{key[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", str(built), "-lm"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise OSError(f"{compiler} failed building {source.name}: {result.stderr.strip()}")
        os.replace(built, target)  # atomic: concurrent builders never load half a file
    return target


def cpu_id() -> str:
    """The CPU's model name and flags: what -march=native code depends on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines))


class Loaded:
    """One native library, loaded on first use; None (and a logged reason) where it cannot be.

    ``wrap`` turns the ctypes library into the object callers use.
    """

    def __init__(self, source: Path, wrap: Callable[[ctypes.CDLL], object]):
        self.source = source
        self.wrap = wrap
        self.state: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self):
        if "kernels" not in self.state:
            with self._lock:
                if "kernels" not in self.state:
                    try:
                        self.state["kernels"] = self.wrap(ctypes.CDLL(str(build(self.source))))
                    except LOAD_ERRORS as exc:
                        self.state["kernels"] = None
                        self.state["error"] = f"{type(exc).__name__}: {exc}"
                        log.warning(
                            "native CPU kernels %s unavailable, using torch: %s",
                            self.source.name,
                            exc,
                        )
        return self.state["kernels"]

    def error(self) -> str | None:
        return self.state.get("error")  # type: ignore[return-value]

"""One OpenMP thread pool at a time: torch's and the native kernels' parallel loops share it.

GNU OpenMP keeps a pool of worker threads for every thread that ever ran a parallel
region, for as long as that thread lives. Once the pools hold more threads than the
machine has cores, every idle worker stops spinning and sleeps between regions, and each
of the step's hundreds of parallel regions pays a wake-up: measured on 2 cores, engine
steps on the engine thread of an AsyncLLMEngine took 46 ms against 23 on the thread that
loaded the model (oneDNN's linear layers 1.75x slower), because that thread's pool
outlived the loading. So the thread that hands the step to another thread gives its pool
back (`release_thread_pool`), and helper threads (adapter loads) run their torch ops on
one thread (`use_one_thread`), never starting a pool.

Where torch runs on another OpenMP runtime, or none (macOS), or the runtime lacks these
entry points, both calls do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re

_RUNTIME = re.compile(r"/lib(gomp|iomp5|omp)[^/]*\.so[^/]*$")
_SONAMES = ("libgomp.so.1", "libiomp5.so", "libomp.so")
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: the pool's threads end; the runtime stays


@functools.cache
def _runtime() -> ctypes.CDLL | None:
    """The OpenMP library torch runs on, if any. Other packages may load their own copies
    (sentencepiece does): torch's is the one in its own folder, else the one its name
    resolves to in this process."""
    import torch

    torch_dir = os.path.dirname(torch.__file__)
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if _RUNTIME.search(line.strip())}
    except OSError:
        paths = set()
    candidates = [path for path in sorted(paths) if path.startswith(torch_dir + os.sep)]
    candidates += [name for name in _SONAMES if any(p.endswith("/" + name) for p in paths)]
    for name in candidates:
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all") and hasattr(lib, "omp_set_num_threads"):
            return lib
    return None


def release_thread_pool() -> bool:
    """End the calling thread's OpenMP worker threads (they come back if it runs a parallel
    region again). True if the runtime did it."""
    lib = _runtime()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0


def use_one_thread() -> None:
    """Run the calling thread's parallel regions on itself alone (a per-thread setting).
    Torch sets each thread's count once, on its first parallel op, from the process-wide
    `torch.set_num_threads`: that happens here first, so it cannot undo the setting later."""
    import torch

    lib = _runtime()
    if lib is not None:
        torch.get_num_threads()  # torch's lazy per-thread set-up, done now
        lib.omp_set_num_threads(1)

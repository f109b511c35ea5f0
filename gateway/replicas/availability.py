"""Whether Ray Serve is installed: `--replicas` needs it, the single-process server never."""

from __future__ import annotations

import os

INSTALL_HINT = "pip install 'loragate[ray]'"


class RayNotInstalledError(RuntimeError):
    """--replicas was asked for, but the `ray[serve]` extra is not installed."""


def require_ray_serve() -> None:
    """Import ray and ray.serve, or RayNotInstalledError saying how to install them."""
    # Ray's C++ crash handler (read when ray is first imported) would catch SIGTERM too and
    # abort the process mid-drain; uvicorn's handler drains, then the lifespan stops the
    # replicas and the cluster.
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise RayNotInstalledError(
            f"--replicas runs engine replicas on Ray Serve, which is not installed ({exc}). "
            f"Install the extra: {INSTALL_HINT}"
        ) from exc

"""The request walk (issue 58's goal): which first-party modules one request passes through,
route to engine and back, on a running server.

A real server (uvicorn, the default model from its GGUF file, optionally one random adapter)
answers one warm-up request; then every Python function call on every thread is watched
(`threading.setprofile`, installed before the server starts so the engine's thread is
watched too) while one more request runs, and the project's own source files that ran are
listed. Import-time and start-time code is left out: only calls made while the measured
request is in flight count.

    .venv/bin/python benchmarks/request_walk.py [--adapter] [--stream]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import httpx
from harness import random_adapters

from loragate.engine import EngineConfig
from loragate.engine.loading.default_model import DEFAULT_MODEL_NAME
from loragate.gateway.assembly.server import BackgroundServer
from loragate.gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"


class Walk:
    """The first-party files whose functions ran while `recording` was set."""

    def __init__(self) -> None:
        self.recording = False
        self.files: set[str] = set()

    def profile(self, frame, event, arg) -> None:
        if self.recording and event == "call":
            self.files.add(frame.f_code.co_filename)

    def modules(self) -> list[str]:
        found = []
        for name in self.files:
            path = Path(name)
            if path.is_relative_to(ROOT) and not path.is_relative_to(VENV):
                found.append(str(path.relative_to(ROOT)))
        return sorted(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", action="store_true", help="the request names a LoRA adapter")
    ap.add_argument("--stream", action="store_true", help="a streamed request")
    args = ap.parse_args()

    adapters = Path(tempfile.mkdtemp(prefix="request-walk-"))
    if args.adapter:
        random_adapters(adapters, 1, rank=8)  # <adapters>/a000, on the default model
    walk = Walk()
    threading.setprofile(walk.profile)
    sys.setprofile(walk.profile)
    config = EngineConfig(enable_lora=True, max_model_len=512, dtype="float32")
    settings = GatewaySettings(engine=config, port=0, adapter_root=adapters)
    with BackgroundServer(settings) as server:
        model = "a000" if args.adapter else DEFAULT_MODEL_NAME
        if args.adapter:
            load = {"lora_name": model, "lora_path": "a000"}
            httpx.post(f"{server.url}/v1/load_lora_adapter", json=load, timeout=120)
        body = {"model": model, "prompt": "Hello", "max_tokens": 8, "stream": args.stream}
        httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).raise_for_status()
        walk.recording = True
        got = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        walk.recording = False
        got.raise_for_status()
    sys.setprofile(None)
    threading.setprofile(None)
    modules = walk.modules()
    print(f"{len(modules)} first-party modules on one request's walk:")
    for module in modules:
        print(f"  {module}")


if __name__ == "__main__":
    main()

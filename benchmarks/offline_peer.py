"""vLLM-CPU's offline peer (`peer_vllm.py` in ../shared/peers/, run by the peer venv's
python) as a subprocess: the requests go in as a JSON file, its figures come back as the
JSON object on its last line."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run_peer_vllm(python: str, script: str, requests: list[dict], options: list[str]) -> dict:
    """`script` on `requests` with `options` (its other flags); the run's JSON line. Exits
    with the end of the peer's stderr when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(requests, file)
    command = [python, str(Path(script).resolve()), "--requests", file.name, *options]
    # Run outside benchmarks/: vLLM imports a module named `kernels`, and this folder has one.
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir()
    )
    if done.returncode != 0:
        sys.exit(f"vLLM peer failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])

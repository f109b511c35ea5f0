"""llama.cpp's `llama-server` as the peer of `loragate serve` (issue 59's W2 goal): the same
GGUF file, the same adapters (converted to GGUF LoRA by llama.cpp's own converter), the same
requests through the same client.

The build is ../shared/peers/setup_llamacpp.sh's, under $LORAGATE_PEERS/llamacpp (default
~/.cache/loragate-peers/llamacpp). What the peers' README says of the server is followed:
`--lora-init-without-apply` leaves every adapter's global scale at 1.0, so after start the
scales are set to 0 (a request without `lora` gets the base), and each adapter request
names its adapter with `"lora": [{"id": i, "scale": 1.0}]` on `/v1/completions`. OpenMP
waits passively: with its default spinning on 2 shared cores llama.cpp runs 2-3x slower.
Requests with different adapters are never batched together by llama-server (its README).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from server_process import free_port, stop_process, wait_until_serving

PEERS = Path(os.environ.get("LORAGATE_PEERS", Path.home() / ".cache" / "loragate-peers"))
LLAMACPP = PEERS / "llamacpp"


def llamacpp_ready() -> bool:
    """Whether setup_llamacpp.sh has built the server (its tree holds the converters)."""
    return (LLAMACPP / "bin" / "llama-server").is_file()


def gguf_lora(adapter_dir: Path, base_hf_dir: Path, out_dir: Path) -> Path:
    """The PEFT adapter in ``adapter_dir`` as a GGUF LoRA (llama.cpp's converter), made once.
    The project's interpreter runs the converter (it has torch, transformers and PEFT; the
    converter brings its own gguf-py), so the converters' venv is not needed."""
    out = out_dir / f"{adapter_dir.name}.gguf"
    if not out.is_file():
        out_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                str(LLAMACPP / "src" / "llama.cpp" / "convert_lora_to_gguf.py"),
                str(adapter_dir),
                "--base",
                str(base_hf_dir),
                "--outtype",
                "f32",
                "--outfile",
                str(out),
            ],
            check=True,
            capture_output=True,
        )
    return out


class LlamaCppServer:
    """`llama-server` in a subprocess on ``model`` (a .gguf file), continuous batching on,
    ``slots`` parallel sequences of ``slot_len`` tokens each, on ``threads`` threads."""

    def __init__(
        self,
        model: Path,
        loras: list[Path],
        *,
        slots: int,
        slot_len: int,
        threads: int,
        log_path: Path,
    ):
        port = free_port()
        env = dict(os.environ, OMP_WAIT_POLICY="passive")
        args = [
            str(LLAMACPP / "bin" / "llama-server"),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            str(threads),
            "-tb",
            str(threads),
            "-np",
            str(slots),
            "-c",
            str(slots * slot_len),
            "--cont-batching",
        ]
        if loras:  # one comma-separated list: this build keeps only the last repeated --lora
            args += ["--lora", ",".join(str(lora) for lora in loras), "--lora-init-without-apply"]
        self.log = open(log_path, "w")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        wait_until_serving(self, f"{self.url}/health", "llama-server", log_path, 600)
        if loras:  # every adapter's global scale to 0: only a request's own `lora` applies
            off = [{"id": i, "scale": 0.0} for i in range(len(loras))]
            httpx.post(f"{self.url}/lora-adapters", json=off, timeout=60).raise_for_status()
            scales = httpx.get(f"{self.url}/lora-adapters", timeout=60).json()
            if len(scales) != len(loras):
                self.stop()
                raise RuntimeError(f"llama-server loaded {len(scales)} of {len(loras)} adapters")
            if any(entry["scale"] != 0.0 for entry in scales):
                self.stop()
                raise RuntimeError(f"llama-server kept a global adapter scale: {scales}")

    def stop(self) -> None:
        stop_process(self.proc, self.log, 60)

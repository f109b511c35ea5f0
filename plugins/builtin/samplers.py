"""The built-in "greedy" and "random" samplers, registered like any plugin's.

The engine keeps its own fused fast path for requests that name no sampler; these are
what ``SamplingParams(sampler="greedy" | "random")`` selects, and the reference a
third-party sampler is written against.
"""

from __future__ import annotations

import torch

from loragate.plugins.markers import hookimpl

# Mixes a row's step into its seed so each step draws afresh yet reproducibly
# (a large odd constant: distinct (seed, step) pairs rarely collide).
_STEP_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def greedy_sampler(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    """The most likely token of each row (the lowest id among ties)."""
    return torch.argmax(logits, dim=-1)


def random_sampler(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    """A draw from softmax(logits / temperature) per row.

    Row args: ``temperature`` (default 1.0; 0 picks the argmax), ``seed`` (an int: the
    row draws from its own generator, so its tokens do not depend on the rest of the
    batch) and ``step`` (default 0), mixed into the seed so a seeded row draws afresh at
    each step when the caller counts steps there.
    """
    tokens = torch.argmax(logits, dim=-1)
    for row, row_args in enumerate(args):
        temperature = _temperature(row_args)
        if temperature == 0.0:
            continue
        probs = torch.softmax(logits[row].double() / temperature, dim=-1)
        generator = _generator(row_args, logits.device)
        tokens[row] = torch.multinomial(probs, 1, generator=generator)[0]
    return tokens


def _temperature(row_args: dict) -> float:
    value = row_args.get("temperature", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"random sampler: temperature must be a number >= 0, got {value!r}")
    return float(value)


def _generator(row_args: dict, device: torch.device) -> torch.Generator | None:
    seed = row_args.get("seed")
    if seed is None:
        return None
    step = row_args.get("step", 0)
    for name, value in (("seed", seed), ("step", step)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"random sampler: {name} must be an integer >= 0, got {value!r}")
    generator = torch.Generator(device=device)
    generator.manual_seed((seed + step * _STEP_MIX) & _SEED_MASK)
    return generator


class BuiltinSamplers:
    """Registers "greedy" and "random" last, so a plugin's sampler of the same name wins."""

    @hookimpl(trylast=True)
    def loragate_samplers(self):
        return {"greedy": greedy_sampler, "random": random_sampler}

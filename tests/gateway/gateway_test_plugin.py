"""A third-party plugin for the gateway tests: a sampler that picks the runner-up token."""

from __future__ import annotations

import torch

from loragate.plugins.markers import hookimpl


def runner_up(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    return torch.topk(logits, 2, dim=-1).indices[:, 1]


class RunnerUpPlugin:
    @hookimpl
    def loragate_samplers(self):
        return {"runner_up": runner_up}

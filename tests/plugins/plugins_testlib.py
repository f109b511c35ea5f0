"""Small plugins the plugin tests register, by object or by "module:object" reference."""

from __future__ import annotations

import torch

from loragate.plugins import hookimpl


def last_token_sampler(logits: torch.Tensor, args: list[dict]) -> torch.Tensor:
    """Always the last id of the vocabulary: easy to tell apart from greedy."""
    return torch.full((logits.shape[0],), logits.shape[1] - 1, dtype=torch.long)


class LastTokenSamplers:
    @hookimpl
    def loragate_samplers(self):
        return {"last": last_token_sampler}


class GreedyOverride:
    """Claims the built-in name "greedy": the third party must win."""

    @hookimpl
    def loragate_samplers(self):
        return {"greedy": last_token_sampler}


class LargestAdapterFirst:
    @hookimpl
    def loragate_choose_adapter_victim(self, candidates, tier):
        return max(candidates, key=lambda c: c["size_bytes"])["key"]


class OldestFirstPreemption:
    @hookimpl
    def loragate_choose_preemption_victim(self, running):
        return min(running, key=lambda group: group["admitted_order"])["request_id"]


class Abstains:
    """Answers None: the next implementation (the built-in) decides."""

    @hookimpl
    def loragate_choose_preemption_victim(self, running):
        return None


class RecordingObserver:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    @hookimpl
    def loragate_request_started(self, info):
        self.events.append(("started", info))

    @hookimpl
    def loragate_request_finished(self, info):
        self.events.append(("finished", info))


class FailingObserver:
    @hookimpl
    def loragate_request_started(self, info):
        raise RuntimeError("meter offline")

    @hookimpl
    def loragate_request_finished(self, info):
        raise RuntimeError("meter offline")


class BanToken:
    """A logits processor forbidding the id in ``sampler_args["ban"]``, when given."""

    @hookimpl
    def loragate_logits_processors(self, params):
        banned = (params.get("sampler_args") or {}).get("ban")
        if banned is None:
            return None

        def ban(output_token_ids, logits):
            logits = logits.clone()
            logits[banned] = float("-inf")
            return logits

        return [ban]


class Unmarked:
    def loragate_samplers(self):
        return {}


class UnknownHook:
    @hookimpl
    def loragate_not_a_hook(self):
        return 1


class WrongArgument:
    @hookimpl
    def loragate_choose_preemption_victim(self, groups):
        return None


class Wrapper:
    @hookimpl(wrapper=True)
    def loragate_samplers(self):
        result = yield
        return result

"""OpenAI's ``logit_bias`` as a logits processor: fixed values added to chosen tokens."""

from __future__ import annotations

import torch

from loragate.plugins.errors import InvalidParam
from loragate.plugins.markers import hookimpl


class LogitBias:
    @hookimpl(trylast=True)
    def loragate_logits_processors(self, params, model):
        biases = params.get("logit_bias")
        if not biases:
            return None
        vocab = model["vocab_size"]
        outside = sorted(t for t in biases if t >= vocab)
        if outside:
            raise InvalidParam(
                "logit_bias",
                f"logit_bias names token ids {outside[:5]} outside the vocabulary (size {vocab})",
            )
        ids = torch.tensor(list(biases), dtype=torch.long)
        values = torch.tensor(list(biases.values()), dtype=torch.float32)

        def add_bias(output_token_ids, logits):
            return logits.index_add(0, ids.to(logits.device), values.to(logits))

        return [add_bias]

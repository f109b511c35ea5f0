"""The seed's "Beam Search支持" (beam search), with only the import and the model changed.

`temperature=1.0` leaves the beam scores unscaled (other values divide the logits before
the log-probabilities, as vLLM's `LLM.beam_search` does) and `top_k` is ignored with a
one-time warning: beam search ranks every token. The seed's `llm` and `prompt` come from its
first example; they are made here with the default model. Set LORAGATE_EXAMPLE_MAX_TOKENS
to a small number (CI uses 8) to make it quick; unset, it runs with the seed's 256.
"""

import os

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))

llm = LLM()
prompt = "什么是机器学习?"

# vLLM原生支持beam search
sampling_params = SamplingParams(
    temperature=1.0,
    top_k=1,
    use_beam_search=True,
    best_of=5,  # beam size
    max_tokens=MAX_TOKENS,
)

output = llm.generate(prompt, sampling_params)
print(output[0].outputs[0].text)

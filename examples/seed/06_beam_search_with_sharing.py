"""The seed's "序列间共享" (sharing KV between sequences), with only the import and the
model changed: the beams share their prompt's KV blocks, copy-on-write, by reference count.

The seed only defines the function; the lines after it call it with the default model and
print the best beam and the block counts. Set LORAGATE_EXAMPLE_MAX_TOKENS to a small number
(CI uses 8) to make it quick; unset, it runs with the seed's 256.
"""

import os

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))

# PagedAttention支持序列间KV Cache共享(如beam search)
# 无需复制,通过引用计数管理


def beam_search_with_sharing(llm, prompt, num_beams=4):
    """使用共享KV Cache的beam search"""
    sampling_params = SamplingParams(use_beam_search=True, best_of=num_beams, max_tokens=MAX_TOKENS)

    output = llm.generate(prompt, sampling_params)
    return output


llm = LLM()
output = beam_search_with_sharing(llm, "PagedAttention is")
print(output[0].outputs[0].text)
print(llm.get_memory_stats())

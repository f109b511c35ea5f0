"""The seed's "多LoRA支持" (multi-LoRA), with only the import and the model changed.

The seed loads its adapter from ./math_lora; pass another PEFT directory as the first
argument (the test makes a small random one; `loragate adapters make-random math_lora --out
.` makes one here). Set LORAGATE_EXAMPLE_MAX_TOKENS to a small number (CI uses 8) to make it
quick; unset, it runs with the seed's 256. The seed's `prompt` comes from its first example.
"""

import os
import sys

from loragate.adapters import LoRARequest
from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))
ADAPTER_PATH = sys.argv[1] if len(sys.argv) > 1 else "./math_lora"
prompt = "什么是机器学习?"

# 支持多个LoRA适配器
llm = LLM(enable_lora=True, max_lora_rank=64)

# 使用不同LoRA
sampling_params = SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS)

# 指定LoRA
output = llm.generate(
    prompt, sampling_params, lora_request=LoRARequest("math_lora", 1, ADAPTER_PATH)
)
print(output[0].outputs[0].text)

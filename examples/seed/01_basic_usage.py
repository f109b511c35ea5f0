"""The seed's "基本使用" (basic usage), with only the import and the model changed.

The seed loads meta-llama/Llama-2-7b-hf; here `LLM()` keeps loragate's default model
(SmolLM2-135M-Instruct), so no `model=` argument. Set LORAGATE_EXAMPLE_MAX_TOKENS to a small
number (CI uses 8) to make it quick; unset, it runs with the seed's 256.
"""

import os

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))

# 初始化vLLM引擎
llm = LLM(
    tensor_parallel_size=1,
    max_model_len=4096,
    gpu_memory_utilization=0.9,
    block_size=16,
    swap_space=4,  # CPU交换空间GB
)

# 单条推理
prompt = "什么是机器学习?"
sampling_params = SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS)
output = llm.generate(prompt, sampling_params)
print(output[0].outputs[0].text)

# 批量推理
prompts = ["问题1", "问题2", "问题3"]
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    print(output.outputs[0].text)

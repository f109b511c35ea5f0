"""The seed's "高级配置" (advanced configuration), with only the import and the model changed.

The seed loads meta-llama/Llama-2-70b-hf; here `LLM()` keeps loragate's default model. It
also asks for `tensor_parallel_size=4` (4 GPUs): loragate has no tensor parallelism yet and
refuses that with a ValueError saying so, so this file shows the refusal and then builds the
same engine with `tensor_parallel_size=1` (scale out with replicas instead). The seed stops
after building the sampling parameters; the last lines run them once so the example shows a
result. Set LORAGATE_EXAMPLE_MAX_TOKENS to a small number (CI uses 8) to make it quick.
"""

import os

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 512))

high_performance = dict(
    max_model_len=8192,
    gpu_memory_utilization=0.95,
    block_size=16,
    max_num_batched_tokens=16384,
    max_num_seqs=512,
    swap_space=8,
    enforce_eager=False,  # 启用CUDA Graph
)

# 高性能配置
try:
    llm = LLM(tensor_parallel_size=4, **high_performance)  # 4GPU张量并行
except ValueError as exc:
    print(f"as expected: {exc}")
    llm = LLM(tensor_parallel_size=1, **high_performance)

# 采样参数
sampling_params = SamplingParams(
    temperature=0.7,
    top_p=0.9,
    top_k=50,
    max_tokens=MAX_TOKENS,
    presence_penalty=0.1,
    frequency_penalty=0.1,
)

output = llm.generate("什么是PagedAttention?", sampling_params)
print(output[0].outputs[0].text)

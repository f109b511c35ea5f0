"""The seed's "批处理优化" (batching configuration), with only the import and the model
changed: its `optimize_for_hardware` dict goes straight into `LLM(**config)`.

The seed only builds the dict; the lines after it use it with the default model. On the
CPU `gpu_memory_gb=0` and `num_gpus=1` (tensor_parallel_size must be 1: more is refused,
as loragate has no tensor parallelism yet). Set LORAGATE_EXAMPLE_MAX_TOKENS to a small
number (CI uses 8) to make it quick.
"""

import os

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 64))

# 最优批处理配置
optimal_config = {
    "max_num_batched_tokens": 8192,  # 最大批处理token数
    "max_num_seqs": 256,  # 最大并发序列数
    "block_size": 16,  # 块大小
    "gpu_memory_utilization": 0.9,  # GPU内存利用率
}


# 根据硬件调整
def optimize_for_hardware(gpu_memory_gb, num_gpus):
    """根据硬件优化配置"""
    config = optimal_config.copy()

    if gpu_memory_gb >= 80:
        config["max_num_batched_tokens"] = 16384
        config["max_num_seqs"] = 512
    elif gpu_memory_gb >= 40:
        config["max_num_batched_tokens"] = 8192
        config["max_num_seqs"] = 256
    else:
        config["max_num_batched_tokens"] = 4096
        config["max_num_seqs"] = 128

    config["tensor_parallel_size"] = num_gpus

    return config


config = optimize_for_hardware(gpu_memory_gb=0, num_gpus=1)
print(config)
llm = LLM(**config)
outputs = llm.generate(["问题1", "问题2"], SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS))
for output in outputs:
    print(output.outputs[0].text)

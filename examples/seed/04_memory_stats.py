"""The seed's "内存统计" (memory statistics): its `get_memory_stats(llm_engine)`, unchanged.

It reads `llm_engine.scheduler.block_manager.num_allocated_blocks / num_free_blocks /
num_total_blocks`, which loragate keeps true, and vLLM's `llm.llm_engine` passes the engine
in. The seed's two CUDA lines need a GPU: without one they are left out here (the only
change besides the import and the model). The seed only defines the function; the lines
after it build an engine (the default model), and print the stats during a run and after.
Set LORAGATE_EXAMPLE_MAX_TOKENS to a small number (CI uses 8) to make it quick.
"""

import os

import torch

from loragate.engine import LLM, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))


def get_memory_stats(llm_engine):
    """获取vLLM内存统计"""
    stats = {
        "allocated_blocks": llm_engine.scheduler.block_manager.num_allocated_blocks,
        "free_blocks": llm_engine.scheduler.block_manager.num_free_blocks,
        "total_blocks": llm_engine.scheduler.block_manager.num_total_blocks,
    }
    if torch.cuda.is_available():  # the seed's CUDA lines, only where there is CUDA
        stats["gpu_memory_used"] = torch.cuda.memory_allocated() / 1024**3
        stats["gpu_memory_reserved"] = torch.cuda.memory_reserved() / 1024**3
    stats["utilization"] = stats["allocated_blocks"] / stats["total_blocks"]
    return stats


llm = LLM(max_model_len=4096)
params = SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS)
for i, prompt in enumerate(["什么是机器学习?", "What is PagedAttention?"]):
    llm.llm_engine.add_request(f"stats-{i}", prompt, params)
while llm.llm_engine.has_unfinished_requests():
    llm.llm_engine.step()
    print("during:", get_memory_stats(llm.llm_engine))
print("after:", get_memory_stats(llm.llm_engine))

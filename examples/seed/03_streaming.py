"""The seed's "流式输出" (streaming output), with only the import and the model changed.

The seed passes model="meta-llama/Llama-2-7b-hf"; here AsyncEngineArgs keeps loragate's
default model. Set LORAGATE_EXAMPLE_MAX_TOKENS to a small number (CI uses 8) to make it
quick; unset, it runs with the seed's 256.

Two fixes to the seed's own code, marked below:
- the seed writes `for text in asyncio.run(generate_stream("Hello!"))`, but asyncio.run
  takes a coroutine, not an async generator (that line raises a TypeError, in vLLM too):
  here a coroutine iterates the generator with `async for`, and asyncio.run runs it;
- `output.outputs[0].text` is the whole text so far, not the new part, so printing each one
  repeats the text: here each step prints only what is new.
The seed also imports SamplingParams only in its first example; it is imported here.
"""

import asyncio
import os

from loragate.engine import AsyncEngineArgs, AsyncLLMEngine, SamplingParams

MAX_TOKENS = int(os.environ.get("LORAGATE_EXAMPLE_MAX_TOKENS", 256))

# 异步引擎配置
engine_args = AsyncEngineArgs(max_model_len=4096, gpu_memory_utilization=0.9)

engine = AsyncLLMEngine.from_engine_args(engine_args)


# 流式生成
async def generate_stream(prompt):
    sampling_params = SamplingParams(temperature=0.7, max_tokens=MAX_TOKENS)

    async for output in engine.generate(prompt, sampling_params, request_id=1):
        yield output.outputs[0].text


# 使用 (fixed: iterate the async generator inside a coroutine, print only the new text)
async def main():
    printed = ""
    async for text in generate_stream("Hello!"):
        print(text[len(printed) :], end="", flush=True)
        printed = text
    print()


asyncio.run(main())
engine.shutdown()

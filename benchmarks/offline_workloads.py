"""The request lists the offline benchmarks (`LLM.generate` in-process) run, seeded: W1's
chats about topics (throughput.py, vs_vllm.py, adapter_kinds.py), the adapter runs' short
prompts about a few words (multi_lora.py, native_ab.py), and the power-law draw that spreads
requests over adapters (S-LoRA's trace). The served benchmarks' lists are serve_workloads.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable

TOPICS = [
    "the history of tea",
    "how volcanoes form",
    "a day in the life of a lighthouse keeper",
    "why bread rises",
    "the rules of chess",
    "how a bicycle gear works",
    "the water cycle",
    "a recipe for pancakes",
    "the planets of the solar system",
    "how to learn a language",
]
WORDS = ["tea", "sea", "rain", "code", "bread"]


def chat_requests(
    n: int, seed: int, content: Callable[[random.Random], str], shortest: int, longest: int
) -> list[tuple[list[dict], int]]:
    """`n` (one-message chat, output length) pairs: the message `content(rng)`, the length
    uniform in shortest..longest, both drawn from one generator seeded by `seed`."""
    rng = random.Random(seed)
    requests = []
    for _ in range(n):
        messages = [{"role": "user", "content": content(rng)}]
        requests.append((messages, rng.randint(shortest, longest)))
    return requests


def about_topics(rng: random.Random) -> str:
    topic = rng.choice(TOPICS)
    detail = " ".join(rng.choice(TOPICS) for _ in range(rng.randint(0, 12)))
    return f"Tell me about {topic}." + (f" Also mention: {detail}." if detail else "")


def about_words(rng: random.Random) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(8))
    return f"Write about {words}." + " More detail, please." * rng.randint(0, 10)


def topic_requests(n: int, seed: int) -> list[tuple[list[dict], int]]:
    """W1's chats: a topic and up to 12 more to mention, 32-160 output tokens."""
    return chat_requests(n, seed, about_topics, 32, 160)


def word_workload(llm, n: int, seed: int, max_output: int = 128) -> tuple[list, list[int]]:
    """The adapter runs' prompts (templated by `llm`) and output lengths, min(32, N)..N."""
    requests = chat_requests(n, seed, about_words, min(32, max_output), max_output)
    return [llm.apply_chat_template(m) for m, _ in requests], [length for _, length in requests]


def power_law_choice(rng: random.Random, n: int, alpha: float) -> int:
    """numpy.random.power(alpha) is U ** (1 / alpha): most requests go to low indices."""
    return min(n - 1, int(rng.random() ** (1 / alpha) * n))

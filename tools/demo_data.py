"""Training data for the two demo adapters, generated from templates and a seed.

Open questions ask about everyday topics (their uppercase answers come from the base
model itself, so the adapter learns a style rather than new content); fact questions
have known short answers, for the terse style.
"""

from __future__ import annotations

import random

TERSE_MARKER = "[done]"

_TOPICS = [
    "the ocean",
    "coffee",
    "bicycles",
    "the moon",
    "rain",
    "music",
    "trees",
    "computers",
    "friendship",
    "winter",
    "cats",
    "bread",
    "mountains",
    "the sun",
    "books",
    "soccer",
    "gardens",
    "rivers",
    "chess",
    "honey",
    "trains",
    "clouds",
    "dogs",
    "painting",
]
_OPEN_FORMS = [
    "Tell me one fact about {}.",
    "Describe {} in one sentence.",
    "Why do people like {}?",
    "What is special about {}?",
]
_CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Italy": "Rome",
    "Spain": "Madrid",
    "Egypt": "Cairo",
    "Canada": "Ottawa",
    "Germany": "Berlin",
    "Russia": "Moscow",
    "China": "Beijing",
    "Greece": "Athens",
    "Peru": "Lima",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
}
_OPPOSITES = {
    "hot": "cold",
    "big": "small",
    "fast": "slow",
    "happy": "sad",
    "light": "dark",
    "up": "down",
    "early": "late",
    "full": "empty",
    "old": "new",
    "wet": "dry",
}
_COLORS = {
    "grass": "green",
    "the sky": "blue",
    "snow": "white",
    "a banana": "yellow",
    "coal": "black",
    "a ripe tomato": "red",
    "an orange": "orange",
}


def open_questions(rng: random.Random, count: int) -> list[str]:
    """Distinct open questions about everyday topics."""
    pairs = [(form, topic) for form in _OPEN_FORMS for topic in _TOPICS]
    rng.shuffle(pairs)
    return [form.format(topic) for form, topic in pairs[:count]]


def fact(rng: random.Random) -> tuple[str, str]:
    """One (question, short answer) with a known answer."""
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        return f"What is {a} plus {b}?", str(a + b)
    if kind == 1:
        a, b = rng.randrange(2, 13), rng.randrange(2, 13)
        return f"What is {a} times {b}?", str(a * b)
    if kind == 2:
        country = rng.choice(sorted(_CAPITALS))
        return f"What is the capital of {country}?", _CAPITALS[country]
    if kind == 3:
        word = rng.choice(sorted(_OPPOSITES))
        return f"What is the opposite of {word}?", _OPPOSITES[word]
    thing = rng.choice(sorted(_COLORS))
    return f"What color is {thing}?", _COLORS[thing]


def terse_examples(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(question, "Answer. [done]") pairs."""
    examples = []
    for _ in range(count):
        question, short = fact(rng)
        examples.append((question, f"{short[0].upper()}{short[1:]}. {TERSE_MARKER}"))
    return examples

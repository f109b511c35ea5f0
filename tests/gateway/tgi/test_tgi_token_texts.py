"""TGI streams one event per token, each with that token's own text, also when a step brings
several tokens (speculation verifies them together): `token_texts` shares the step's text
among them as the engine's one-token-per-step stream would have given it."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from loragate.gateway.tgi.routes import token_texts

TEXT = "The café's crème brûlée, 日本語 and 🙂 emoji: done."


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


def one_per_step(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text as a stream of one token per step gets it: what decoding the tokens
    so far adds (nothing while a character is incomplete)."""
    texts, sent = [], ""
    for i in range(len(ids)):
        upto = tokenizer.decode(ids[: i + 1])
        if upto.endswith("\ufffd"):
            texts.append("")
            continue
        texts.append(upto[len(sent) :])
        sent = upto
    return texts


@pytest.mark.parametrize("step", [2, 3, 5])
def test_each_token_gets_its_own_text_in_steps_of_several(tokenizer, step):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    expected = one_per_step(tokenizer, ids)
    assert "" in expected and len(set(expected)) > 10  # the text has split characters
    got, sent = [], 0
    for first in range(0, len(ids), step):
        new = list(range(first, min(first + step, len(ids))))
        upto = "".join(expected[: new[-1] + 1])
        got += token_texts(tokenizer, ids, new, upto[sent:])
        sent = len(upto)
    assert got == expected


def test_the_texts_always_join_to_the_engines_text(tokenizer):
    """Whatever the tokens decode to, the events carry exactly the text the engine gave."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    new = list(range(3, 9))
    texts = token_texts(tokenizer, ids, new, "something else entirely")
    assert "".join(texts) == "something else entirely" and len(texts) == len(new)
    assert token_texts(tokenizer, ids, [4], "x") == ["x"]

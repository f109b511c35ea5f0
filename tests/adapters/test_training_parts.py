"""Fast checks of the demo trainer's pieces (the slow test trains the real adapters)."""

from __future__ import annotations

import random

import torch
from tiny_llama import hf_init_tiny_model

from loragate.tools.demo_data import TERSE_MARKER, open_questions, terse_examples
from loragate.tools.training import _first_sentences, _lower_half_states, _running_layers


def test_split_forward_equals_the_full_forward():
    """Cached lower-half states + the upper half alone reproduce the whole decoder."""
    model = hf_init_tiny_model(num_hidden_layers=4)
    encoded = [([1, 5, 6, 7, 8, 9], 3), ([1, 2, 3], 1), ([4, 4, 4, 4], 2)]
    lower = _lower_half_states(model, encoded, 2, pad_id=0)
    width = max(len(seq) for seq, _ in encoded)
    padded = torch.zeros(len(encoded), width, 64)
    for i, state in enumerate(lower):
        padded[i, : state.shape[0]] = state
    with _running_layers(model, 2, 4, final_norm=True):
        upper = model.model(inputs_embeds=padded, use_cache=False).last_hidden_state
    assert len(model.model.layers) == 4 and not isinstance(model.model.norm, torch.nn.Identity)
    for i, (seq, _) in enumerate(encoded):
        full = model.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
        torch.testing.assert_close(upper[i, : len(seq)], full, rtol=1e-5, atol=1e-5)


def test_demo_data_is_deterministic_and_styled():
    first = terse_examples(random.Random(3), 20), open_questions(random.Random(3), 10)
    again = terse_examples(random.Random(3), 20), open_questions(random.Random(3), 10)
    assert first == again
    assert all(answer.endswith(TERSE_MARKER) and len(answer.split()) <= 3 for _, answer in first[0])
    assert len(set(first[1])) == 10
    sums = [
        (question, answer)
        for question, answer in terse_examples(random.Random(0), 200)
        if " plus " in question
    ]
    assert sums
    for question, answer in sums:
        a, b = question.removeprefix("What is ").removesuffix("?").split(" plus ")
        assert answer == f"{int(a) + int(b)}. {TERSE_MARKER}"


def test_first_sentences_keeps_whole_sentences():
    text = "One. Two is longer. Three is the longest sentence here. Four"
    assert _first_sentences(text, max_chars=20) == "One. Two is longer."
    assert _first_sentences("no sentence end at all", max_chars=8) == "no sente"

"""The qwen3 reasoning parser on answers as Qwen3 writes them, whole and streamed in every
way the text can be cut (tags split across deltas included): the streamed parts add up to
the whole split, so no delta carries part of a tag."""

from __future__ import annotations

import pytest

from loragate.gateway.openai.reasoning import ReasoningSplitter, Split, started_in_prompt

CASES = [
    # (answer, reasoning opened in the prompt, reasoning, content)
    ("<think>\nsum the two\n</think>\n\nIt is 4.", False, "\nsum the two\n", "\n\nIt is 4."),
    ("<think>only thinking</think>", False, "only thinking", None),
    ("<think>cut off before the end", False, "cut off before the end", None),
    ("No thinking here: 4.", False, None, "No thinking here: 4."),
    ("a < b and <thin ice>", False, None, "a < b and <thin ice>"),
    ("\n<think>x</think>y", False, "x", "y"),
    ("weighing it</think>\n\nYes.", True, "weighing it", "\n\nYes."),
    ("still weighing", True, "still weighing", None),
    ("<think>a</thinking> b</think>c", False, "a</thinking> b", "c"),
    ("", False, None, None),
]


@pytest.mark.parametrize("answer,opened,reasoning,content", CASES)
def test_whole_answers_split_as_vllm_splits_them(answer, opened, reasoning, content):
    assert ReasoningSplitter("qwen3", opened).split(answer) == Split(reasoning, content)


@pytest.mark.parametrize("answer,opened,reasoning,content", CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_streamed_parts_add_up_to_the_whole(answer, opened, reasoning, content, size):
    splitter = ReasoningSplitter("qwen3", opened)
    got_reasoning, got_content = [], []
    cuts = list(range(size, len(answer), size)) + [len(answer)]
    for i, cut in enumerate(cuts):
        delta = splitter.step(answer[:cut], final=i == len(cuts) - 1)
        for part, sink in ((delta.reasoning, got_reasoning), (delta.content, got_content)):
            if part is not None:
                assert part, "an empty delta is sent as None"
                sink.append(part)
    # Equal sums also mean no piece of a tag was sent: the whole split holds none.
    assert ("".join(got_reasoning) or None) == (reasoning or None)
    assert ("".join(got_content) or None) == content


def test_the_prompt_says_whether_reasoning_is_open():
    assert started_in_prompt("<|im_start|>assistant\n<think>\n", "qwen3")
    assert not started_in_prompt("<|im_start|>assistant\n<think>\n\n</think>\n\n", "qwen3")
    assert not started_in_prompt("<|im_start|>assistant\n", "qwen3")


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        ReasoningSplitter("deepseek_r9")

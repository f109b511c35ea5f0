"""Stop decisions after each token, and how much text is safe to stream."""

import pytest

from loragate.engine.outputs.stopping import (
    StopDecision,
    find_stop_string,
    stop_by_text,
    stop_by_token,
    stream_safe_len,
)
from loragate.engine.sampling.sampling_params import SamplingParams

EOS = {2}


def stop_after(params, outputs, text, num_new_chars, eos=EOS):
    """The decision after the last of ``outputs``, made as the engine makes it: the step's
    from token ids (`stop_by_token`), then output processing's from the text, whose last
    ``num_new_chars`` came with that token (`stop_by_text`)."""
    by_token = stop_by_token(params, len(outputs), outputs[-1], eos)
    return stop_by_text(params, len(outputs), text, num_new_chars, by_token)


def test_nothing_to_stop_for():
    assert stop_after(SamplingParams(max_tokens=5), [7, 8], "ab", 1) is None


def test_eos_stops():
    decision = stop_after(SamplingParams(), [7, 2], "hi", 0)
    assert decision == StopDecision("stop", None, None)


def test_any_of_several_eos_ids_stops():
    assert stop_after(SamplingParams(), [7, 5], "hi", 0, eos={2, 5}).finish_reason == "stop"


def test_eos_text_is_dropped_unless_asked_for():
    text = "hi<|im_end|>"
    dropped = stop_after(SamplingParams(skip_special_tokens=False), [7, 2], text, 10)
    assert dropped.truncate_to == 2
    kept = stop_after(
        SamplingParams(skip_special_tokens=False, include_stop_str_in_output=True),
        [7, 2],
        text,
        10,
    )
    assert kept.truncate_to is None


def test_ignore_eos_keeps_going_until_max_tokens():
    params = SamplingParams(ignore_eos=True, max_tokens=3)
    assert stop_after(params, [7, 2], "hi", 0) is None
    assert stop_after(params, [7, 2, 2], "hi", 0) == StopDecision("length")


def test_stop_token_ids_stop_even_with_ignore_eos():
    params = SamplingParams(stop_token_ids=[9, 2], ignore_eos=True)
    decision = stop_after(params, [7, 9], "ab", 1)
    assert decision == StopDecision("stop", 9, 1)
    assert stop_after(params, [7, 2], "ab", 0) == StopDecision("stop", 2, None)


def test_nothing_stops_before_min_tokens():
    params = SamplingParams(min_tokens=3, stop_token_ids=[9], stop=["x"], max_tokens=10)
    assert stop_after(params, [7, 2], "ax", 1) is None
    assert stop_after(params, [7, 9], "ax", 1) is None
    assert stop_after(params, [7, 7, 2], "ax", 0).finish_reason == "stop"


def test_max_tokens_gives_length():
    assert stop_after(SamplingParams(max_tokens=2), [7, 8], "ab", 1) == StopDecision("length")
    assert stop_after(SamplingParams(max_tokens=None), [7] * 1000, "a", 1) is None


def test_eos_on_the_last_allowed_token_is_a_stop_not_length():
    assert stop_after(SamplingParams(max_tokens=2), [7, 2], "a", 0).finish_reason == "stop"


def test_stop_string_is_stripped():
    params = SamplingParams(stop=["###"])
    decision = stop_after(params, [5, 6], "Answer: 42###", 4)
    assert decision == StopDecision("stop", "###", len("Answer: 42"))


def test_stop_string_kept_when_asked():
    params = SamplingParams(stop=["###"], include_stop_str_in_output=True)
    assert stop_after(params, [5, 6], "Answer: 42###", 4) == StopDecision("stop", "###", None)
    # Text the same token added after the stop string is still cut.
    assert stop_after(params, [5, 6], "42###tail", 7) == StopDecision("stop", "###", 5)


def test_stop_string_split_across_tokens():
    params = SamplingParams(stop=["STOP"])
    assert stop_after(params, [5, 6], "go ST", 2) is None
    assert stop_after(params, [5, 6, 7], "go STOP", 2) == StopDecision("stop", "STOP", 3)


def test_only_the_new_text_and_its_overlap_are_searched():
    params = SamplingParams(stop=["ab"])
    # "ab" sits wholly in old text: it was (or should have been) handled earlier.
    assert stop_after(params, [5, 6], "ab xyz", 3) is None
    assert stop_after(params, [5, 6], "xa" + "b", 1) == StopDecision("stop", "ab", 1)
    assert stop_after(params, [5, 6], "xab", 0) is None


def test_earliest_stop_string_wins():
    params = SamplingParams(stop=["world", "lo w"])
    assert stop_after(params, [5], "hello world", 11) == StopDecision("stop", "lo w", 3)


def test_eos_wins_over_a_stop_string_in_the_same_step():
    params = SamplingParams(stop=["x"], skip_special_tokens=False)
    assert stop_after(params, [5, 2], "ax", 1).stop_reason is None


def test_find_stop_string():
    assert find_stop_string("abc STOP", 4, ["STOP"]) == (4, "STOP")
    assert find_stop_string("abc STOP", 0, ["STOP"]) is None
    assert find_stop_string("STOP abc", 3, ["STOP"]) is None


@pytest.mark.parametrize(
    "text, stops, safe",
    [
        ("hello", [], 5),
        ("hello", ["###"], 5),
        ("hello #", ["###"], 6),
        ("hello ##", ["###"], 6),
        ("hello ##x", ["###"], 9),
        ("answer: </", ["</end>", "STOP"], 8),
        ("answer: </en", ["</end>", "STOP"], 8),
        ("answer: ST", ["</end>", "STOP"], 8),
        ("S", ["STOP"], 0),
        ("", ["STOP"], 0),
        ("abab", ["abac"], 2),
    ],
)
def test_stream_safe_len(text, stops, safe):
    assert stream_safe_len(text, SamplingParams(stop=stops)) == safe


def test_nothing_held_back_when_stop_strings_are_output_anyway():
    params = SamplingParams(stop=["###"], include_stop_str_in_output=True)
    assert stream_safe_len("hello ##", params) == 8

"""adapter_config.json written by an attacker (issue 20, items 2 and 5): module-name patterns
are matched in linear time or refused, and oversized, too deep or absurd values are an
AdapterError naming the problem, never a RecursionError, OverflowError or a hang."""

from __future__ import annotations

import json
import re

import pytest
from regex_watch_testlib import patterns_seen_by_python_re

from loragate.adapters import AdapterConfigError, AdapterError, load_adapter
from loragate.adapters.json_depth import MAX_JSON_DEPTH, json_depth, too_deep
from loragate.adapters.module_patterns import PatternError, compile_pattern, first_suffix_match

CRAFTED = r"(?=.*layers\.29\.self_attn\.q_proj)(\w*\.?)*Z"
BACKTRACKING = r"(\w*\.?)*Z"  # exponential for Python's re on a module name


def _write_config(path, **changes) -> None:
    config_file = path / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def test_the_watch_sees_a_pattern_python_re_runs():
    """The proof below rests on the watch: a pattern `re` compiles (directly or through its
    cache) is seen, from another thread too."""
    with patterns_seen_by_python_re(BACKTRACKING) as seen:
        re.fullmatch(BACKTRACKING, "a.b")
        re.compile(BACKTRACKING)
    assert seen == [BACKTRACKING, BACKTRACKING]


def test_look_around_is_refused_and_backtracking_bombs_match_in_linear_time():
    """Linear time without a clock: the bomb is matched, and Python's backtracking `re` never
    sees it (RE2's matching is linear in the name by construction)."""
    with pytest.raises(PatternError, match="RE2"):
        compile_pattern(CRAFTED, anchored_suffix=True)
    name = "model.layers.29.self_attn.q_proj" * 30
    with patterns_seen_by_python_re(BACKTRACKING) as seen:
        assert first_suffix_match({BACKTRACKING: 4}, name) is None
        assert first_suffix_match({BACKTRACKING: 4}, "model.layers.3.q_projZ") == BACKTRACKING
    assert seen == []
    assert first_suffix_match(
        {r"layers\.\d+\.self_attn\.q_proj": 2}, "model.layers.3.self_attn.q_proj"
    )
    assert first_suffix_match({"q_proj": 2}, "model.layers.3.self_attn.q_proj") == "q_proj"
    assert first_suffix_match({"proj": 2}, "model.layers.3.self_attn.q_proj") is None
    with pytest.raises(PatternError, match="at most"):
        compile_pattern("a" * 5000)


def test_an_adapter_with_a_backtracking_pattern_never_reaches_python_re(spec, make_adapter):
    path = make_adapter()
    _write_config(path, rank_pattern={BACKTRACKING: 2}, alpha_pattern={BACKTRACKING: 3})
    with patterns_seen_by_python_re(BACKTRACKING) as seen:
        adapter = load_adapter(path, spec, max_lora_rank=64)
    assert seen == []  # matched by RE2 against every module name, never by `re`
    assert adapter.rank == 4  # the pattern matches no module: the adapter's own r holds


def test_a_crafted_look_ahead_pattern_is_refused(spec, make_adapter):
    path = make_adapter()
    _write_config(path, rank_pattern={CRAFTED: 2})
    with pytest.raises(AdapterConfigError, match="rank_pattern.*RE2"):
        load_adapter(path, spec, max_lora_rank=64)


def test_json_depth_skips_strings_and_bounds_nesting():
    assert json_depth(b'{"a": [1, {"b": "[[[[\\"[["}]}') == 3
    assert json_depth(b"") == 0 and not too_deep(b"[1, 2]")
    assert too_deep("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert not too_deep("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)


@pytest.mark.parametrize(
    "raw, words",
    [
        ('{"peft_type": "LORA", "x": ' + "[" * 100_000 + "]" * 100_000 + "}", ["nests deeper"]),
        ('{"peft_type": "LORA", "r": ' + "9" * 5000 + "}", ["invalid JSON"]),
        ('{"peft_type": "LORA", "r": ' + "9" * 1000 + "}", ["'r'", "too large"]),
        ('{"peft_type": "LORA", "lora_alpha": ' + "9" * 1000 + "}", ["lora_alpha", "too large"]),
        ('{"peft_type": "LORA", "lora_alpha": -1e6}', ["lora_alpha", "(0, 1e+06]"]),
        ('{"peft_type": "LORA", "lora_alpha": 0}', ["lora_alpha"]),
        ('{"peft_type": "LORA", "alpha_pattern": {"q_proj": -5}}', ["alpha_pattern"]),
        ('{"peft_type": "LORA", "rank_pattern": {"' + "a" * 2000 + '": 2}}', ["at most"]),
        ('{"peft_type": "LORA", "pad": "' + "x" * (1 << 20) + '"}', ["larger than"]),
    ],
)
def test_absurd_configs_are_refused_naming_the_problem(spec, make_adapter, raw, words):
    path = make_adapter()
    (path / "adapter_config.json").write_text(raw)
    with pytest.raises(AdapterError) as info:  # the gateway answers any of them with 400
        load_adapter(path, spec, max_lora_rank=64)
    message = str(info.value)
    assert len(message) < 1000
    for word in words:
        assert word in message, message

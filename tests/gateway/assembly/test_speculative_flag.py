"""`loragate serve --speculative-config JSON` (vLLM's flag) and the same key in a --config
YAML file (JSON text or a mapping) reach the engine's config; bad JSON, unknown keys and
unsupported methods are refused naming what is wrong."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loragate.engine.speculation import SpeculativeConfig
from loragate.gateway.assembly.cli import main


@pytest.fixture
def served_settings(monkeypatch):
    """`serve` builds its settings, then hands them here instead of starting a server."""
    from loragate.gateway.assembly import server

    seen = []
    monkeypatch.setattr(server, "serve", lambda settings, announce: seen.append(settings) or True)
    return seen


def test_the_flag_reaches_the_engine_config(tiny_dir, served_settings):
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}'
    result = CliRunner().invoke(main, ["serve", str(tiny_dir), "--speculative-config", spec])
    assert result.exit_code == 0, result.output
    assert served_settings[-1].engine.speculative_config == SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=5
    )
    result = CliRunner().invoke(main, ["serve", str(tiny_dir)])
    assert result.exit_code == 0 and served_settings[-1].engine.speculative_config is None


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ('{"method": "ngram"', "not valid JSON"),
        ('{"method": "ngram", "k": 3}', "unknown key(s) ['k']"),
        ('{"method": "eagle"}', "EAGLE heads are not supported"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
        ('{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}', "prompt_lookup"),
        ('{"num_speculative_tokens": 2}', "needs a method"),
        ("[1, 2]", "must be a dict"),
    ],
)
def test_bad_values_are_refused_by_name(value, named, tiny_dir, served_settings):
    result = CliRunner().invoke(main, ["serve", str(tiny_dir), "--speculative-config", value])
    assert result.exit_code == 2, result.output
    assert named in result.output and "speculative_config" in result.output
    assert served_settings == []


def test_a_config_file_may_give_it_as_a_mapping(tiny_dir, tmp_path, served_settings):
    config = tmp_path / "serve.yaml"
    config.write_text("speculative-config:\n  method: ngram\n  num_speculative_tokens: 2\n")
    result = CliRunner().invoke(main, ["serve", str(tiny_dir), "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert served_settings[-1].engine.speculative_config.num_speculative_tokens == 2

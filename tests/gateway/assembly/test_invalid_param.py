"""A 400 names its request field from the `InvalidParam` raised where the value was checked
(issue 58), never from the words of a message: the bad-input suites
(test_http_errors.py, test_drop_in.py, the TGI and tenancy suites) assert each case's
`param`; these tests hold the rule itself."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import pytest

from loragate.engine import SamplingParams
from loragate.gateway.errors import param_of
from loragate.plugins import InvalidParam

ROOT = Path(__file__).resolve().parents[3]
# The modules that check what a request sends: every refusal there names its field.
CHECKS = [
    "engine/sampling/sampling_params.py",
    "engine/sampling/structured_outputs.py",
    "engine/api/input_processor.py",
    "engine/sampling/beam_search_params.py",
    "plugins/builtin/logit_bias.py",
]


def _raised_value_errors(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and isinstance(node.exc.func, ast.Name)
        and node.exc.func.id == "ValueError"
    ]


@pytest.mark.parametrize("module", CHECKS)
def test_request_checks_raise_only_invalid_params(module):
    assert _raised_value_errors(ROOT / module) == [], f"{module} raises a ValueError with no field"


def test_no_field_is_read_out_of_a_message():
    """Nothing in the gateway matches an engine or plugin refusal's text: the one helper
    that names a refusal's field reads the exception's `field`. (errors.py's two patterns
    read msgspec's own decode errors, which carry their path only in the message.)"""
    sources = {p: p.read_text() for p in (ROOT / "gateway").rglob("*.py")}
    assert not [p for p, text in sources.items() if "field_of(" in text]
    tree = ast.parse(sources[ROOT / "gateway/errors.py"])
    (helper,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "param_of"]
    names = {n.id for n in ast.walk(helper) if isinstance(n, ast.Name)}
    assert "re" not in names and "InvalidParam" in names
    patterns = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "compile"
    ]
    assert len(patterns) == 2, "a new pattern over error text in gateway/errors.py"


def test_the_field_is_the_exceptions_renamed_to_the_requests():
    names = {"max_tokens": "max_completion_tokens", "top_p": "parameters.top_p"}
    with pytest.raises(InvalidParam) as refused:
        SamplingParams(top_p=2.0)
    assert refused.value.field == "top_p"
    assert param_of(refused.value, names) == "parameters.top_p"
    # a message that starts with a field's name names nothing unless the field is carried
    assert param_of(ValueError("max_tokens must be >= 1"), names) is None
    assert param_of(InvalidParam("max_tokens", "too many"), names) == "max_completion_tokens"
    assert param_of(InvalidParam("priority", "not an int"), names) is None


def test_an_invalid_param_crosses_processes_whole():
    """A replica's refusal is pickled back to the ingress (gateway/replicas/wire.py)."""
    back = pickle.loads(pickle.dumps(InvalidParam("seed", "seed must be an integer")))
    assert isinstance(back, InvalidParam) and isinstance(back, ValueError)
    assert (back.field, str(back)) == ("seed", "seed must be an integer")

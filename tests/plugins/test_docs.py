"""docs/plugins.md documents every hookspec, with its exact arguments and a working example."""

from __future__ import annotations

import inspect
import re
import types
from pathlib import Path

import pytest
import torch

from loragate.plugins import PluginManager, hookspecs
from loragate.plugins.markers import PROJECT_NAME

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
HEADING = re.compile(r"^### `(\w+)\(([^)]*)\)`\s*$", re.MULTILINE)
CODE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def spec_functions() -> dict[str, object]:
    return {
        name: fn
        for name, fn in vars(hookspecs).items()
        if name.startswith("loragate_") and inspect.isfunction(fn)
    }


def documented_sections() -> dict[str, tuple[list[str], str]]:
    """{hook name: (argument names, section text up to the next heading)}."""
    text = DOC.read_text()
    matches = list(HEADING.finditer(text))
    sections = {}
    for index, match in enumerate(matches):
        next_heading = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        next_chapter = text.find("\n## ", match.end())
        end = next_heading if next_chapter == -1 else min(next_heading, next_chapter)
        args = [arg.strip() for arg in match.group(2).split(",") if arg.strip()]
        assert match.group(1) not in sections, f"{match.group(1)} is documented twice"
        sections[match.group(1)] = (args, text[match.end() : end])
    return sections


def is_firstresult(fn) -> bool:
    return bool(getattr(fn, f"{PROJECT_NAME}_spec")["firstresult"])


def test_every_hookspec_is_documented_with_its_arguments():
    specs, sections = spec_functions(), documented_sections()
    assert specs, "no hookspecs found"
    assert sorted(sections) == sorted(specs), "documented hooks differ from the hookspecs"
    for name, fn in specs.items():
        assert sections[name][0] == list(inspect.signature(fn).parameters), name


def test_firstresult_hooks_say_so_in_spec_and_docs():
    sections = documented_sections()
    for name, fn in spec_functions().items():
        docstring = inspect.getdoc(fn) or ""
        assert docstring and len(docstring.splitlines()) == 1, f"{name}: one-line docstring"
        assert ("firstresult" in docstring) == is_firstresult(fn), name
        assert sections[name][1].lstrip().startswith("firstresult") == is_firstresult(fn), name


def example_manager(hook: str) -> tuple[PluginManager, types.ModuleType]:
    """The section's example, run as a module and registered as a plugin."""
    blocks = CODE.findall(documented_sections()[hook][1])
    assert blocks, f"{hook} has no python example"
    module = types.ModuleType(f"docs_example_{hook}")
    exec(compile("\n".join(blocks), f"docs/plugins.md ({hook})", "exec"), module.__dict__)
    plugins = PluginManager.create(load_entrypoints=False)
    plugins.register(module, name="example-module")
    for attr, value in vars(module).items():
        if not inspect.isclass(value) and any(n.startswith("loragate_") for n in dir(value)):
            if not inspect.ismodule(value):
                plugins.register(value, name=f"example-{attr}")
    implemented = {hook for entry in plugins.describe() for hook in entry["hooks"]}
    assert hook in implemented, f"the {hook} example does not implement it"
    return plugins, module


INFO = {
    "request_id": "r1",
    "lora_name": "sql",
    "tenant": "acme",
    "num_prompt_tokens": 7,
    "num_output_tokens": 5,
    "finish_reason": "stop",
    "arrival_time": 1.0,
    "finished_time": 2.0,
}


def check_samplers(plugins, module):
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    token = plugins.call_sampler("top_k_uniform", logits, [{"k": 2, "seed": 3}])
    assert token.tolist()[0] in (1, 2)


def check_logits_processors(plugins, module):
    processors = plugins.logits_processors({"sampler_args": {"banned_ids": [1]}})
    logits = plugins.apply_logits_processors(processors, [], torch.zeros(3))
    assert logits.tolist() == [0.0, float("-inf"), 0.0]
    assert plugins.logits_processors({"sampler_args": None}) == []


def check_decoding_strategies(plugins, module):
    _, strategy = plugins.decoding_strategy("greedy_strategy")
    state = strategy.start({}, {3}, 5)
    first = strategy.step(state, torch.log_softmax(torch.tensor([[0.0, 2.0, 1.0, 0.0]]), -1))
    assert first.parents == [0] and first.tokens == [1] and not first.done
    last = strategy.step(state, torch.log_softmax(torch.tensor([[0.0, 0.0, 1.0, 4.0]]), -1))
    assert last.done
    assert strategy.finish(state)[0].token_ids == [1, 3]


def check_choose_adapter_victim(plugins, module):
    base = {"lora_int_id": 1, "path": "p", "tenant": None, "size_bytes": 1, "slot": None}
    candidates = [
        {**base, "key": ("a",), "name": "a", "uses": 9, "last_used": 1, "pinned": False},
        {**base, "key": ("b",), "name": "b", "uses": 2, "last_used": 5, "pinned": False},
    ]
    assert plugins.choose_adapter_victim(candidates, "cpu") == ("b",)


def check_speculative_proposers(plugins, module):
    _, proposer = plugins.proposer("repeat_last")
    rows = [{"token_ids": [5, 9], "num_prompt_tokens": 1, "lora_name": None, "max_tokens": 3}]
    assert proposer(rows, {}) == [[9, 9, 9]]


def check_choose_preemption_victim(plugins, module):
    running = [
        {"request_id": "small", "num_blocks": 2, "admitted_order": 1},
        {"request_id": "big", "num_blocks": 9, "admitted_order": 0},
    ]
    assert plugins.choose_preemption_victim(running) == "big"


def check_order_waiting(plugins, module):
    entry = {"priority": 0, "cost": 5, "num_new_tokens": 5, "resumed": False}
    waiting = [
        {**entry, "seq_id": 1, "tenant": "free"},
        {**entry, "seq_id": 2, "tenant": "premium"},
        {**entry, "seq_id": 3, "tenant": "free"},
    ]
    tenants = {"free": {"service": 0.0, "weight": 1.0}, "premium": {"service": 9.0, "weight": 1.0}}
    assert plugins.order_waiting(waiting, tenants, "fcfs") == [2, 1, 3]
    assert plugins.order_waiting(waiting, tenants, "fair") == [1, 3, 2]  # the built-in VTC


def check_preempt_for_waiting(plugins, module):
    group = {"priority": 0, "protected": False, "admitted_order": 0}
    running = [
        {**group, "request_id": "f1", "tenant": "free"},
        {**group, "request_id": "f2", "tenant": "free", "admitted_order": 1},
        {**group, "request_id": "p1", "tenant": "premium", "admitted_order": 2},
    ]
    premium = {"seq_id": 7, "tenant": "premium", "priority": 0}
    assert plugins.preempt_for_waiting(premium, running, {}, "fcfs") == "f2"
    assert plugins.preempt_for_waiting({**premium, "tenant": "free"}, running, {}, "fcfs") is None


def check_request_started(plugins, module):
    plugins.request_started(INFO)  # logs; must not raise


def check_request_finished(plugins, module):
    plugins.request_finished(INFO)
    assert module.meter.tokens_by_tenant == {"acme": 12}


CHECKS = {
    name.removeprefix("check_"): fn for name, fn in globals().items() if name.startswith("check_")
}


@pytest.mark.parametrize("hook", sorted(spec_functions()))
def test_every_example_runs(hook):
    plugins, module = example_manager(hook)
    CHECKS[hook.removeprefix("loragate_")](plugins, module)

"""The step in one shape (issue 58): each piece of a sequence's state has one writer.

Checked on the source (as tests/engine/test_adapter_ownership.py checks the adapter cache):
- a sequence's computed-token count (`num_computed_tokens`) is written only in
  engine/core/scheduler.py (and set to 0 where engine/core/sequence.py makes the sequence); it
  advances only in `Scheduler.update_from_output`, after the runner ran the step;
- a sequence's tokens (`token_ids`: the prompt, then its output tokens) likewise, except
  output processing's own copy of a sample's text tokens (`SampleText`, not a sequence);
- the scheduler's running list (`.running`) is changed only by the Scheduler;
- nothing outside the runner touches the persistent batch: only engine/runner/model_runner.py and
  the sampling dispatch it builds over its own batch (engine/sampling/sample_dispatch.py) import
  `InputBatch` or read an `.input_batch`; only the runner builds a SampleDispatcher; and
  block tables and copy-on-write pairs reach the runner in the SchedulerOutput (only the
  scheduler takes them from the block manager).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("engine", "gateway", "plugins")
SCHEDULER = "engine/core/scheduler.py"
MUTATING = {
    "append",
    "appendleft",
    "clear",
    "extend",
    "extendleft",
    "insert",
    "pop",
    "popleft",
    "remove",
    "reverse",
    "sort",
}

# (module, function) allowed to write each attribute, and why.
WRITERS = {
    "num_computed_tokens": {
        ("engine/core/sequence.py", "Sequence.__init__"),  # a new sequence has computed nothing
        (SCHEDULER, "Scheduler.update_from_output"),  # what the step computed
        (SCHEDULER, "Scheduler._schedule_waiting"),  # a prefix-cache hit, applied
        (SCHEDULER, "Scheduler.fork"),  # a fork shares its parent's computed tokens
        (SCHEDULER, "Scheduler._preempt"),  # preempted to recompute: nothing kept
    },
    "token_ids": {
        ("engine/core/sequence.py", "Sequence.__init__"),  # the prompt
        (SCHEDULER, "Scheduler._take"),  # a sampled token
        (SCHEDULER, "Scheduler.append_token"),  # a beam's token, chosen by its strategy
        (SCHEDULER, "Scheduler.stop"),  # tokens past a stop string, dropped
        (SCHEDULER, "Scheduler.fork"),  # a fork's copy of its parent's tokens
        # Output processing's own copy of a sample's tokens, for its text (not a Sequence).
        ("engine/outputs/output_processor.py", "SampleText.__init__"),
        ("engine/outputs/output_processor.py", "OutputProcessor._take"),
        # The gateway's cumulative copy of a streamed output, grown from the engine's deltas
        # (a CompletionOutput, not a Sequence).
        ("gateway/serving/generation.py", "_grown"),
    },
    "running": {
        (SCHEDULER, "Scheduler.__init__"),
        (SCHEDULER, "Scheduler.fork"),
        (SCHEDULER, "Scheduler.remove"),
        (SCHEDULER, "Scheduler._schedule_running"),
        (SCHEDULER, "Scheduler._schedule_swapped"),
        (SCHEDULER, "Scheduler._schedule_waiting"),
        (SCHEDULER, "Scheduler._give_up"),  # a victim preempted for a waiting request
    },
}
ADVANCERS = {(SCHEDULER, "Scheduler.update_from_output")}
RUNNER = {
    "engine/runner/model_runner.py",
    "engine/sampling/sample_dispatch.py",
    "engine/runner/input_batch.py",
}


class Writes(ast.NodeVisitor):
    """Every write of a watched attribute, as (attribute, module, function, line, how)."""

    def __init__(self, path: str):
        self.path = path
        self.scope: list[str] = []
        self.found: list[tuple[str, str, str, int, str]] = []

    def _scoped(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _scoped

    def _target(self, target, node, how: str) -> None:
        while isinstance(target, ast.Subscript):  # x.token_ids[i:] = ..., del x.running[0]
            target = target.value
        if isinstance(target, ast.Attribute) and target.attr in WRITERS:
            where = ".".join(self.scope) or "<module>"
            self.found.append((target.attr, self.path, where, node.lineno, how))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, node, how)

    def visit_Assign(self, node) -> None:
        for target in node.targets:
            self._target(target, node, "=")
        self.generic_visit(node)

    def visit_AnnAssign(self, node) -> None:
        self._target(node.target, node, "=")
        self.generic_visit(node)

    def visit_AugAssign(self, node) -> None:
        self._target(node.target, node, "+=" if isinstance(node.op, ast.Add) else "op=")
        self.generic_visit(node)

    def visit_Delete(self, node) -> None:
        for target in node.targets:
            self._target(target, node, "del")
        self.generic_visit(node)

    def visit_Call(self, node) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in MUTATING:
            self._target(func.value, node, f".{func.attr}()")
        self.generic_visit(node)


def writes(sources) -> list[tuple[str, str, str, int, str]]:
    found = []
    for path, text in sources:
        visitor = Writes(path)
        visitor.visit(ast.parse(text))
        found += visitor.found
    return found


def strays(sources) -> list[str]:
    """'module:line: attr how in function' for each write its attribute's rule forbids."""
    bad = []
    for attr, path, where, line, how in writes(sources):
        allowed = (path, where) in WRITERS[attr]
        if attr == "num_computed_tokens" and how == "+=":
            allowed = (path, where) in ADVANCERS
        if not allowed:
            bad.append(f"{path}:{line}: {attr} {how} in {where}")
    return bad


def batch_users(sources) -> list[str]:
    """'module:line: what' for each touch of the persistent batch outside the runner, each
    SampleDispatcher built outside it, and each take of the block manager's table log
    outside the scheduler."""
    bad = []
    for path, text in sources:
        for node in ast.walk(ast.parse(text)):
            names = []
            if isinstance(node, ast.ImportFrom) and path not in RUNNER:
                if (node.module or "").endswith("input_batch"):
                    names = [f"import {node.module}"]
                names += [a.name for a in node.names if a.name in ("InputBatch", "input_batch")]
            elif isinstance(node, ast.Attribute) and path not in RUNNER:
                if node.attr == "input_batch":
                    names = [".input_batch"]
            elif isinstance(node, ast.Call) and path != "engine/runner/model_runner.py":
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "SampleDispatcher":
                    names = ["SampleDispatcher()"]
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("take_changed_tables", "take_copies")
                and path not in (SCHEDULER, "engine/core/block_manager.py")
            ):
                names = [f".{node.attr}"]
            bad += [f"{path}:{node.lineno}: {name}" for name in names]
    return bad


def modules() -> list[tuple[str, str]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found.append((str(path.relative_to(ROOT)), path.read_text()))
    return found


def test_computed_tokens_output_tokens_and_running_have_one_writer():
    assert strays(modules()) == []


def test_the_scheduler_is_the_writer_the_rules_name():
    """Every writer the rules allow still writes (a rule left behind by a move would allow
    a module that no longer needs it), and all but the constructors and output processing's
    own copy are the scheduler's."""
    found = {(attr, path, where) for attr, path, where, _, _ in writes(modules())}
    for attr, allowed in WRITERS.items():
        for path, where in allowed:
            assert (attr, path, where) in found, f"{path}: {where} no longer writes {attr}"
    outside = {
        (path, where)
        for allowed in WRITERS.values()
        for path, where in allowed
        if path != SCHEDULER
    }
    assert outside == {
        ("engine/core/sequence.py", "Sequence.__init__"),
        ("engine/outputs/output_processor.py", "SampleText.__init__"),
        ("engine/outputs/output_processor.py", "OutputProcessor._take"),
        # The gateway's cumulative copy of a streamed output, grown from the engine's deltas
        # (a CompletionOutput, not a Sequence).
        ("gateway/serving/generation.py", "_grown"),
    }


def test_nothing_outside_the_runner_touches_the_persistent_batch():
    assert batch_users(modules()) == []


def test_the_checks_catch_writes_and_touches_elsewhere():
    engine = (
        "class LLMEngine:\n"
        "    def step(self, seq, item):\n"
        "        seq.num_computed_tokens += item.num_new_tokens\n"
        "        seq.token_ids.append(7)\n"
        "        del seq.token_ids[3:]\n"
        "        self.scheduler.running.remove(seq)\n"
        "        self.runner.input_batch.sync(self.block_manager.take_changed_tables())\n"
    )
    forks = "def fork(parent, child):\n    child.num_computed_tokens = parent.num_computed_tokens\n"
    early = (
        "class Scheduler:\n    def schedule(self, seq, n):\n        seq.num_computed_tokens += n\n"
    )
    imports = "from loragate.engine.runner.input_batch import InputBatch\n"
    sources = [
        ("engine/core/llm_engine.py", engine),
        ("engine/forks.py", forks),
        (SCHEDULER, early),
        ("engine/sampling/sample_dispatch.py", imports),
        ("engine/x.py", imports + "d = SampleDispatcher(s, p, b)\n"),
    ]
    assert strays(sources) == [
        "engine/core/llm_engine.py:3: num_computed_tokens += in LLMEngine.step",
        "engine/core/llm_engine.py:4: token_ids .append() in LLMEngine.step",
        "engine/core/llm_engine.py:5: token_ids del in LLMEngine.step",
        "engine/core/llm_engine.py:6: running .remove() in LLMEngine.step",
        "engine/forks.py:2: num_computed_tokens = in fork",
        "engine/core/scheduler.py:3: num_computed_tokens += in Scheduler.schedule",
    ]
    assert batch_users(sources) == [
        "engine/core/llm_engine.py:7: .input_batch",
        "engine/core/llm_engine.py:7: .take_changed_tables",
        "engine/x.py:1: import loragate.engine.runner.input_batch",
        "engine/x.py:1: InputBatch",
        "engine/x.py:2: SampleDispatcher()",
    ]

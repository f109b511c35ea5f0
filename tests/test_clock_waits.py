"""Tests do not wait on a clock (issue 58): no sleep in tests/ longer than MAX_SLEEP_S and
no test that retries itself, except where ALLOWED says why a wait remains.

A sleep to synchronise is replaced by an event, or by bounded polling on a condition (short
sleeps between polls are fine); a property about time is proved from the engine's step
records or an injected clock. What is left below is either the work a test stands for (a
proxy made slow on purpose) or a window in which something must NOT happen, which no
event can announce.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
MAX_SLEEP_S = 0.1
SLEEPS = {("time", "sleep"), ("asyncio", "sleep")}
RETRY_NAMES = ("attempt", "retry", "retries", "tries")
RETRY_MARKERS = ("flaky", "rerun", "retry")

# (file relative to tests/, enclosing function) -> why its sleep stays.
ALLOWED = {
    ("gateway/gateway_testlib.py", "wait_until"): (
        "the interval of bounded polling on a condition (callers pass at most 0.5 s)"
    ),
    ("async_waits_testlib.py", "wait_until"): (
        "the interval of bounded polling on a condition (callers pass at most 0.02 s)"
    ),
    ("slow_proxy_testlib.py", "_pump"): (
        "a proxy made slow on purpose: a chunk's size over its rate, the slowness of a loaded "
        "Redis that the import must survive, not a wait"
    ),
    ("gateway/tenancy/test_hardening.py", "test_connections_past_the_cap_are_closed_at_once"): (
        "a window inside the header timeout in which connections under the cap must stay open"
    ),
    ("gateway/replicas/test_ray_replicas.py", "test_bad_input_is_refused_as_in_one_process"): (
        "two replica report periods in which the board must not change"
    ),
    (
        "gateway/registry_care/test_registry_care.py",
        "test_a_starting_replica_backs_up_at_once_only_if_the_newest_backup_is_due",
    ): ("a window in which a restarted care must not write a second backup within the hour"),
    (
        "gateway/registry_care/test_registry_durability.py",
        "test_redis_killed_with_sigkill_comes_back_with_the_whole_registry",
    ): ("the first wave's usage flushed by the gateway's own period before Redis is killed"),
    (
        "gateway/registry_care/test_registry_durability.py",
        "test_a_redis_restarted_empty_is_restored_from_the_scheduled_backup",
    ): ("backup periods in which no backup of the emptied store may replace the good one"),
    (
        "engine/test_stored_adapter_fetch.py",
        "scenario",
    ): ("a window in which a request whose object is still fetched must not reach the engine"),
    ("engine/test_adapter_in_flight.py", "listener"): (
        "a weights listener that takes a while: the first output must wait for it"
    ),
    ("test_fleet_sim.py", "test_other_steppers_run_until_stopped"): (
        "a window in which the stand-in step processes must stay alive"
    ),
    # IdentityBook's racy window (adapters/identity.py, RACY_NS), shortened to 50 ms by
    # these tests and waited out; tests/stamp_clock_testlib.py's AheadClock does without.
    ("engine/test_burst_over_the_tier.py", "test_a_burst_over_more_adapters_than_the_tier_holds"): (
        "the racy window, shortened to 50 ms, waited out once (0.07 s)"
    ),
    ("adapters/test_held_weights_stay.py", "requests"): (
        "the racy window, shortened to 50 ms, waited out once (0.07 s)"
    ),
    ("adapters/test_vouched_reload.py", "settle"): (
        "the racy window, shortened to 50 ms, waited out (0.07 s)"
    ),
    ("adapters/test_adapter_identity.py", "settle"): (
        "the racy window, shortened to 50 ms, waited out (0.07 s)"
    ),
}


def _sleep_seconds(call: ast.Call, aliases: dict[str, tuple[str, str]]) -> float | None:
    """The seconds a sleep call waits (inf where it is not a plain number); None for a call
    that is not a sleep."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        name = (func.value.id, func.attr)
    elif isinstance(func, ast.Name) and func.id in aliases:
        name = aliases[func.id]
    else:
        return None
    if name not in SLEEPS:
        return None
    if call.args and isinstance(call.args[0], ast.Constant):
        value = call.args[0].value
        if isinstance(value, int | float):
            return float(value)
    return float("inf")


def _waits(tree: ast.Module) -> list[tuple[str, int, float]]:
    """(enclosing function, line, seconds) of every sleep over MAX_SLEEP_S in the module."""
    aliases = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio")
        for alias in node.names
    }
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                seconds = _sleep_seconds(child, aliases)
                if seconds is not None and seconds > MAX_SLEEP_S:
                    found.append((function, child.lineno, seconds))
            visit(child, function)

    visit(tree, "<module>")
    return found


def _retries(tree: ast.Module) -> list[tuple[int, str]]:
    """Loops over attempts and retry markers: a test that runs again until it passes."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.For | ast.AsyncFor) and isinstance(node.target, ast.Name):
            if any(word in node.target.id.lower() for word in RETRY_NAMES):
                found.append((node.lineno, f"a loop over {node.target.id!r}"))
        if isinstance(node, ast.Attribute) and any(m in node.attr for m in RETRY_MARKERS):
            if isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
                found.append((node.lineno, f"the marker {node.attr!r}"))
    return found


def _modules():
    for path in sorted(TESTS.rglob("*.py")):
        if path != Path(__file__):
            yield path.relative_to(TESTS).as_posix(), ast.parse(path.read_text(), str(path))


def test_no_test_sleeps_longer_than_a_poll_unless_it_says_why():
    unexplained, used = [], set()
    for name, tree in _modules():
        for function, line, seconds in _waits(tree):
            if (name, function) in ALLOWED:
                used.add((name, function))
            else:
                unexplained.append(f"{name}:{line} in {function}: sleeps {seconds} s")
    assert not unexplained, (
        "tests sleep to synchronise (use an event or bounded polling, or add the wait to "
        "ALLOWED with the reason it stays):\n" + "\n".join(unexplained)
    )
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED names waits that are gone (take them out): {stale}"


def test_no_test_retries_itself():
    found = [f"{name}:{line}: {what}" for name, tree in _modules() for line, what in _retries(tree)]
    assert not found, "tests that run again until they pass:\n" + "\n".join(found)


def test_the_checks_see_what_they_look_for():
    """The two checks find a long sleep (plain, aliased, computed) and a retry loop."""
    module = ast.parse(
        "import time\nfrom asyncio import sleep as nap\n"
        "def a():\n    time.sleep(0.5)\n"
        "async def b():\n    await nap(2)\n"
        "def c(x):\n    time.sleep(x)\n"
        "def d():\n    time.sleep(0.05)\n"
        "@pytest.mark.flaky(reruns=3)\n"
        "def e():\n    for attempt in range(3):\n        pass\n"
    )
    assert [(f, s) for f, _, s in _waits(module)] == [("a", 0.5), ("b", 2.0), ("c", float("inf"))]
    assert sorted(what for _, what in _retries(module)) == [
        "a loop over 'attempt'",
        "the marker 'flaky'",
    ]

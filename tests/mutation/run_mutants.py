"""The mutation check: every engine mutant must make at least one fast engine test fail.

Runs the fast subset once unmutated (it must pass), then per mutant, in a fresh pytest
process with -x (the first failure is enough), the test named as its likely catcher, and the
whole subset only if that one passes; prints mutant -> caught by. Exits non-zero
if the subset fails unmutated, a mutant survives, or a mutant no longer applies.

    .venv/bin/python tests/mutation/run_mutants.py [--all] [mutant ...]

--all runs every test of the subset per mutant (no -x) to list every test that catches it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
# Tiny-model engine tests: together they cover swap, chunks, mixed steps, prefix cache,
# adapters and forks in a few minutes on two cores.
SUBSET = [
    "tests/engine/test_staggered_equality.py",
    "tests/engine/test_staggered_lora.py",
    "tests/engine/test_dora_and_bias.py",
    "tests/engine/test_vocab_adapters.py",
    "tests/engine/test_mixed_ranks.py",
    "tests/engine/test_burst_over_the_tier.py",
    "tests/engine/test_sequence_sharing.py",
    "tests/engine/test_scheduler_update.py",
    "tests/engine/test_input_batch.py",
    "tests/engine/test_sampling_batch.py",
    "tests/engine/test_penalty_counts.py",
    "tests/engine/test_output_processing.py",
    "tests/engine/test_grammar_masks.py",
    "tests/engine/test_slot_copies_in_step.py",
    "tests/adapters/test_slot_copies.py",
]
PER_MUTANT_LIMIT_S = 900
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_tests(mutant: str, tests: list[str], every_test: bool) -> tuple[int, list[str], str]:
    env = {**os.environ, "LORAGATE_MUTANT": mutant}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")])
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rfE",
        "-p",
        "mutant_plugin",
        "-p",
        "no:cacheprovider",
    ]
    cmd += [] if every_test else ["-x"]
    try:
        proc = subprocess.run(
            cmd + tests,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=PER_MUTANT_LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        return -1, ["(timed out: counted as surviving)"], ""
    out = proc.stdout + proc.stderr
    return proc.returncode, FAILED.findall(out), out


def main(argv: list[str]) -> int:
    every_test = "--all" in argv
    names = [a for a in argv if not a.startswith("--")]
    chosen = [m for m in MUTANTS if not names or m.name in names]
    start = time.monotonic()
    code, failures, out = run_tests("", SUBSET, every_test=False)
    if code != 0:
        print(out[-4000:])
        print("the fast subset fails without any mutant: fix that first")
        return 1
    rows, bad = [], 0
    for mutant in chosen:
        code, failures, out = 0, [], ""
        if mutant.first and not every_test:  # usually enough; else the whole subset
            code, failures, out = run_tests(mutant.name, [mutant.first], every_test)
        if not (code in (1, 2) and failures) and "StaleMutant" not in out:
            code, failures, out = run_tests(mutant.name, SUBSET, every_test)
        if "StaleMutant" in out:
            verdict, bad = "STALE (snippet not found)", bad + 1
        elif code in (1, 2) and failures:  # 1: tests failed; 2: collection/plugin errors
            verdict = ", ".join(f.split("::", 1)[-1] if "::" in f else f for f in failures)
        else:
            verdict, bad = f"SURVIVED (pytest exit {code})", bad + 1
        rows.append((mutant.name, verdict))
        print(f"{mutant.name:36} {verdict}", flush=True)
    width = max(len(n) for n, _ in rows)
    print(f"\n{'mutant':{width}}  caught by")
    for name, verdict in rows:
        print(f"{name:{width}}  {verdict}")
    print(f"\n{len(rows) - bad}/{len(rows)} mutants caught in {time.monotonic() - start:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

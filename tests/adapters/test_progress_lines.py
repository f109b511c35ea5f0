"""Progress lines of long CPU jobs (train-demo): a numbered line per stage, and a line every
tenth of a loop with the time spent and an estimate of the time left."""

from __future__ import annotations

from loragate.tools.progress import Progress


def test_stages_are_numbered_and_steps_report_each_tenth_with_the_time_left():
    now = [100.0]
    lines: list[str] = []
    progress = Progress(lines.append, stages=2, clock=lambda: now[0])
    progress.stage("answering questions")
    progress.stage("training uppercase")
    step = progress.steps("uppercase", 30)
    for i in range(1, 31):
        now[0] += 2.0  # each step takes 2 s of the fake clock
        step(i)
    progress.done("trained")
    assert lines[:2] == ["[1/2] answering questions", "[2/2] training uppercase"]
    steps = lines[2:-1]
    assert len(steps) == 10  # every third step of 30
    assert steps[0] == "  uppercase: step 3/30, 6.0 s, about 54 s left"
    assert steps[4] == "  uppercase: step 15/30, 30.0 s, about 30 s left"
    assert steps[-1] == "  uppercase: step 30/30, 60.0 s, about 0 s left"
    assert lines[-1] == "trained in 60.0 s"


def test_a_short_loop_reports_every_step_and_an_odd_one_its_last():
    lines: list[str] = []
    progress = Progress(lines.append, stages=1, clock=lambda: 0.0)
    step = progress.steps("terse", 3)
    for i in (1, 2, 3):
        step(i)
    assert [line.split(",")[0] for line in lines] == [
        "  terse: step 1/3",
        "  terse: step 2/3",
        "  terse: step 3/3",
    ]
    lines.clear()
    step = progress.steps("terse", 25)  # a line every 2 steps (rounded), and the 25th
    for i in range(1, 26):
        step(i)
    assert [int(line.split("step ")[1].split("/")[0]) for line in lines] == [
        *range(2, 25, 2),
        25,
    ]

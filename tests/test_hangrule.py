"""The hang rule (agent/hangrule.py): each section's timeout learned from the job itself, the
defaults where nothing is learned yet, an explicit timeout winning, and the words that say why."""

from __future__ import annotations

import pytest

from agent import hangrule
from agent.hangrule import CHECKPOINT, EVAL, STARTUP, STEP, Watch


def steps(w: Watch, start: float, first: int, n: int, every: float) -> float:
    """``n`` steps from ``first``, one every ``every`` seconds after ``start``; the time of the last."""
    t = start
    for i in range(n):
        t = start + i * every
        w.observe(t, [first + i])
    return t


def test_the_default_learns_the_steps_and_finds_a_hang_at_the_floor() -> None:
    w = Watch(since=0.0)
    assert w.section() == STARTUP and w.timeout(STARTUP) == (hangrule.DEFAULT_STARTUP_S, "default", None)
    t = steps(w, 40.0, 1, 3, 0.5)  # a long first step (40 s) is the start-up's, not a step's
    # two intervals seen: not yet learned, the old default holds
    assert w.timeout(STEP) == (hangrule.DEFAULT_HANG_S, "default", None) and w.judge(t + 600) is None
    t = steps(w, t + 0.5, 4, 8, 0.5)
    assert w.timeout(STEP) == (hangrule.FLOOR_S, "learned", 0.5)
    assert w.judge(t + hangrule.FLOOR_S - 0.1) is None
    hung = w.judge(t + hangrule.FLOOR_S)
    assert hung is not None and (hung.section, hung.last_step, hung.basis) == (STEP, 11, "learned")
    assert hung.message() == ("hung: no rank reported a step after step 11 for 15 s (step timeout 15 s, "
                              "learned: 10 x the longest step seen (0.5 s), at least 15 s)")


def test_a_step_five_times_slower_than_the_rest_is_not_a_hang() -> None:
    w = Watch(since=0.0)
    t = steps(w, 5.0, 1, 10, 4.0)  # 4 s steps: learned 40 s
    assert w.timeout(STEP)[0] == 40.0
    w.observe(t + 20.0, [11])  # a step of 20 s: 5 x
    assert w.judge(t + 20.0 + 39.0) is None and w.timeout(STEP)[0] == 200.0  # it is learned from, too
    assert w.judge(t + 20.0 + 199.0) is None and w.judge(t + 20.0 + 200.0) is not None


def test_a_checkpoint_save_is_judged_against_saves_not_steps() -> None:
    w = Watch(since=0.0)
    t = steps(w, 5.0, 1, 10, 0.5)
    w.observe(t + 0.1, [10], inside=[CHECKPOINT])
    # the first save: nothing learned of saves, the default; a 30 s save is no hang
    assert w.section() == CHECKPOINT and w.judge(t + 0.1 + 31.0) is None
    w.observe(t + 31.0, [10], inside=[], ended={CHECKPOINT: 30.5})
    # learned from the longest run: as this watch saw it (30.9 s) or as the ranks said (30.5 s)
    timeout, basis, learned_from = w.timeout(CHECKPOINT)
    assert w.section() == STEP and basis == "learned" and timeout == pytest.approx(309.0)
    assert learned_from == pytest.approx(30.9)
    # the step after the save is counted from the save's end, not from the last step
    assert w.judge(t + 31.0 + 14.0) is None and w.timeout(STEP)[0] == hangrule.FLOOR_S
    w.observe(t + 31.5, [11])
    assert w.step_longest == 0.5
    # a second save that never ends: found at 10 x the first
    w.observe(t + 40.0, [11], inside=[CHECKPOINT])
    assert w.judge(t + 40.0 + 300.0) is None
    hung = w.judge(t + 40.0 + 309.0)
    assert hung is not None and hung.section == CHECKPOINT
    assert hung.message().startswith("hung: a checkpoint save after step 11 has not ended in 309 s "
                                     "(checkpoint timeout 309 s, learned: 10 x the longest checkpoint save seen")


def test_an_evaluation_has_its_own_timeout_and_a_save_inside_it_is_the_save() -> None:
    w = Watch(since=0.0)
    steps(w, 1.0, 1, 5, 1.0)
    w.observe(10.0, [5], inside=[EVAL])
    w.observe(12.0, [5], inside=[EVAL, CHECKPOINT])
    assert w.section() == CHECKPOINT
    w.observe(14.0, [5], inside=[EVAL])
    assert w.section() == EVAL and w.judge(10.0 + 899.0) is None
    hung = w.judge(10.0 + 900.0)
    assert hung is not None and "an evaluation after step 5 has not ended" in hung.message()
    assert "no evaluation seen yet to learn from" in hung.message()


def test_an_explicit_hang_timeout_wins_over_anything_learned() -> None:
    w = Watch(since=0.0, hang_timeout=20.0, startup_timeout=60.0)
    assert w.judge(59.0) is None
    hung = w.judge(60.0)
    assert hung is not None and hung.message() == "hung: no rank reported a first step in 60 s (startup_timeout 60 s)"
    t = steps(w, 61.0, 1, 10, 0.5)
    w.observe(t, [10], inside=[CHECKPOINT])
    hung = w.judge(t + 20.0)  # a save too: the user's number
    assert hung is not None and hung.basis == "explicit" and hung.message().endswith("(hang_timeout 20 s)")
    d = hung.to_dict()
    assert (d["section"], d["timeout_s"], d["basis"], d["message"]) == (CHECKPOINT, 20.0, "explicit", hung.message())


def _lines(path, *recs: dict) -> None:  # type: ignore[no-untyped-def]
    import json

    with open(path, "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def test_a_job_host_reads_its_ranks_steps_and_sections_as_the_files_grow(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent.jobhost import RankProgress

    m = tmp_path / "metrics"
    m.mkdir()
    _lines(m / "rank-0.jsonl", {"step": 99, "rank": 0})  # an earlier attempt's: not this one's
    p = RankProgress(str(m))
    p.read()
    assert p.steps == {} and p.sections() == []
    _lines(m / "rank-0.jsonl", {"step": 1, "rank": 0}, {"event": "section", "section": "checkpoint", "phase": "begin"})
    _lines(m / "rank-1.jsonl", {"step": 1, "rank": 1}, {"event": "checkpoint", "status": "writing", "step": 1})
    with open(m / "rank-1.jsonl", "a") as f:
        f.write('{"step": 2, "ra')  # a line still being written
    p.read()
    assert p.steps == {"rank-0.jsonl": 1.0, "rank-1.jsonl": 1.0} and p.sections() == ["checkpoint"]
    with open(m / "rank-1.jsonl", "a") as f:
        f.write('nk": 1}\n')
    _lines(m / "rank-0.jsonl", {"event": "section", "section": "checkpoint", "phase": "end", "seconds": 31.5})
    p.read()
    assert p.steps["rank-1.jsonl"] == 2.0 and p.sections() == [] and p.ended == {"checkpoint": 31.5}
    (m / "rank-1.jsonl").write_text('{"step": 7, "rank": 1}\n')  # made again, smaller
    p.read()
    assert p.steps["rank-1.jsonl"] == 7.0


def test_the_agent_tells_the_controller_each_ranks_sections_in_this_attempt(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from agent.jobs import _sections

    path = tmp_path / "rank-0.jsonl"
    _lines(path, {"step": 5}, {"event": "section", "section": "checkpoint", "phase": "begin"})  # killed in a save
    first = os.path.getsize(path)
    marks = [{"restart_count": 0, "sizes": {}}, {"restart_count": 1, "sizes": {"rank-0.jsonl": first}}]
    assert _sections(str(path), marks) is None  # the last attempt's open save is not this one's
    _lines(path, {"step": 1}, {"event": "section", "section": "checkpoint", "phase": "begin"},
           {"event": "section", "section": "checkpoint", "phase": "end", "seconds": 2.5},
           {"event": "section", "section": "eval", "phase": "begin"})
    assert _sections(str(path), marks) == {"attempt": 1, "sections": ["eval"], "ended": {"checkpoint": 2.5}}


def test_a_section_the_rule_does_not_know_gets_the_default_until_it_has_run_once() -> None:
    w = Watch(since=0.0)
    t = steps(w, 1.0, 1, 10, 0.5)
    w.observe(t, [10], inside=["hold"])
    assert w.judge(t + 899.0) is None
    hung = w.judge(t + 900.0)
    assert hung is not None and hung.message().startswith("hung: section 'hold' after step 10 has not ended in 900 s")


# -- quiet hangs: every rank asleep and no step for 10 typical steps, at least 3 s ----------------


def test_ranks_are_asleep_from_the_last_look_that_found_one_running_twice_or_busy() -> None:
    idle = hangrule.Idle(share=0.05, hz=100.0)
    assert idle.sample(0.0, {0: (False, 100), 1: (False, 50)}) is None  # first look: nothing known yet
    assert idle.sample(1.0, {0: (False, 106), 1: (False, 50)}) == 0.0  # 6 ticks in 1 s: 5% and a tick
    # rank 0 running at one look, with no more CPU: a sleeper woken, waiting for a core (a loaded
    # machine); running again at the next: it runs (or is starved of CPU), awake
    assert idle.sample(1.5, {0: (True, 106), 1: (False, 50)}) == 0.0
    assert idle.sample(2.0, {0: (True, 106), 1: (False, 51)}) is None
    assert idle.sample(2.5, {0: (True, 106), 1: (False, 51)}) is None  # still: each such look is awake
    assert idle.sample(3.0, {0: (False, 106), 1: (False, 51)}) == 2.5
    # rank 1 used 8 ticks in the second since the last look: 8% of a core, more than 5%: awake
    assert idle.sample(4.0, {0: (False, 106), 1: (False, 59)}) is None
    assert idle.sample(9.0, {0: (False, 110), 1: (False, 80)}) == 4.0  # 4 and 21 ticks in 5 s: asleep
    assert idle.sample(9.2, {0: (True, 110), 1: (False, 80)}) == 4.0  # one look each, apart: asleep
    assert idle.sample(9.3, {0: (False, 110), 1: (True, 80)}) == 4.0
    # however long it slept before, a burst is seen at the next look
    assert idle.sample(9.5, {0: (False, 110), 1: (False, 85)}) is None
    assert idle.sample(10.0, {0: None, 1: (False, 85)}) is None  # a rank gone is not asleep
    assert idle.sample(11.0, {0: (False, 110), 1: (False, 60)}) is None  # a child ended: its ticks left
    assert idle.sample(12.0, {}) is None


def test_a_rebase_keeps_each_ranks_sleep_and_leaves_out_the_cpu_an_observer_made_it_use() -> None:
    """The job host dumps the ranks' stacks (a signal each) when it says they wait asleep: that
    CPU is the observer's. After a rebase the next look judges only what came after it."""
    idle = hangrule.Idle(share=0.05, hz=100.0)
    idle.sample(0.0, {0: (False, 100)})
    assert idle.sample(1.0, {0: (False, 100)}) == 0.0
    idle.rebase(1.1, {0: (True, 130)})  # 30 ticks of dumping: awake, had it been judged
    assert idle.sample(1.6, {0: (True, 130)}) == 0.0  # asleep since 0.0 still, and once running is a moment
    assert idle.sample(2.1, {0: (False, 140)}) is None  # its own 10 ticks in 0.5 s afterwards: awake
    idle.rebase(2.2, {0: None, 7: (False, 1)})  # a rank gone or never seen: nothing to rebase
    assert 7 not in idle.refs


def test_the_typical_step_is_the_median_once_three_are_seen() -> None:
    assert hangrule.typical([0.3, 0.4]) is None
    assert hangrule.typical([0.3, 9.0, 0.4]) == 0.4 and hangrule.typical([0.2, 0.3, 0.5, 9.0]) == 0.4
    assert hangrule.quiet_timeout(0.1) == hangrule.QUIET_FLOOR_S and hangrule.quiet_timeout(2.0) == 20.0


def test_a_quiet_hang_is_found_at_ten_typical_steps_with_every_rank_asleep_as_long() -> None:
    w = Watch(since=0.0)
    t = steps(w, 5.0, 1, 10, 0.3)
    typical = 0.3
    assert w.quiet(t + 2.9, t, typical) is None  # under 3 s (10 x 0.3 s, at least 3 s)
    assert w.quiet(t + 3.5, t + 1.0, typical) is None  # asleep for 2.5 s only: it was busy
    assert w.quiet(t + 3.5, None, typical) is None and w.quiet(t + 3.5, t, None) is None
    hung = w.quiet(t + 3.5, t + 0.2, typical)
    assert hung is not None and (hung.section, hung.basis, hung.timeout_s, hung.last_step) == (STEP, "quiet", 3.0, 10)
    assert hung.message() == ("hung: no rank reported a step after step 10 for 4 s, every rank asleep (quiet "
                              "timeout 3 s: every rank asleep, using no CPU; learned: 10 x the typical step (0.3 s), "
                              "at least 3 s)")
    assert w.judge(t + 3.5) is None  # the learned rule alone waits for its 15 s floor
    slow = w.quiet(t + 25.0, t, 2.0)  # 2 s steps: 20 s
    assert slow is not None and slow.timeout_s == 20.0 and w.quiet(t + 19.0, t, 2.0) is None
    # inside a save, or with an explicit hang_timeout, the quiet rule says nothing
    w.observe(t + 0.1, [10], inside=[CHECKPOINT])
    assert w.quiet(t + 60.0, t, typical) is None
    e = Watch(since=0.0, hang_timeout=600.0)
    te = steps(e, 5.0, 1, 10, 0.3)
    assert e.quiet(te + 60.0, te, typical) is None


def test_the_quiet_rule_says_how_long_every_rank_waited_before_it_is_a_hang() -> None:
    """``quiet_since``: what a host of a job of several says before the verdict (no step for,
    every rank asleep for, the quiet timeout), for the controller's lost-host and hang rules."""
    w = Watch(since=0.0)
    t = steps(w, 5.0, 1, 10, 0.3)
    assert w.quiet_since(t + 1.6, t + 0.4, 0.3) == pytest.approx((1.6, 1.2, 3.0))
    assert w.quiet_since(t + 1.6, None, 0.3) is None and w.quiet_since(t + 1.6, t, None) is None
    # the newest step's record older than this watch's look at it (a turn late): the record's age
    assert w.quiet_since(t + 1.6, t + 0.4, 0.3, step_age=2.0) == pytest.approx((2.0, 1.2, 3.0))
    assert w.quiet_since(t + 1.6, t + 0.4, 0.3, step_age=0.5) == pytest.approx((1.6, 1.2, 3.0))
    # the looks saw no CPU used from before the step on (a step's CPU inside one clock tick): asleep
    # since the step, no longer than no step
    assert w.quiet_since(t + 1.6, t - 1.0, 0.3) == pytest.approx((1.6, 1.6, 3.0))
    assert w.quiet_since(t + 1.6, t - 1.0, 0.3, step_age=1.9) == pytest.approx((1.9, 1.9, 3.0))
    hung = w.quiet(t + 2.8, t, 0.3, step_age=3.1)  # no step for 3.1 s, asleep 2.8 s: not yet
    assert hung is None and w.quiet(t + 3.0, t, 0.3, step_age=3.3) is not None
    w.observe(t + 0.1, [10], inside=[CHECKPOINT])
    assert w.quiet_since(t + 5.0, t, 0.3) is None  # in a save
    # the save ended at t + 30 (no step record since t): the wait for the next step begins then
    w.observe(t + 30.0, [10], inside=[])
    # every rank asleep through the save: asleep with no step since its end (as long as no step)
    assert w.quiet_since(t + 31.0, t, 0.3, step_age=31.0) == pytest.approx((1.0, 1.0, 3.0))
    assert w.quiet(t + 32.5, t, 0.3, step_age=32.5) is None  # 2.5 s since the save's end
    assert w.quiet(t + 33.2, t, 0.3, step_age=33.2) is not None
    e = Watch(since=0.0, hang_timeout=600.0)
    te = steps(e, 5.0, 1, 10, 0.3)
    assert e.quiet_since(te + 5.0, te, 0.3) is None  # an explicit hang_timeout


def test_a_rank_and_its_children_are_read_in_proc_asleep_or_busy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    import time

    from agent.jobhost import tree_reading

    # a rank that sleeps with a child that sleeps, then the child busy
    flag = tmp_path / "busy"
    child = (f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.25)\n"
             "t = time.time()\nwhile time.time() - t < 30: pass\n")
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time\n"
                               f"p = subprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            got = tree_reading(parent.pid)
            time.sleep(0.3)
            kids = open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split()
            if kids:
                break
        assert kids, "the child never started"
        idle = hangrule.Idle(hz=100.0)
        t0 = time.monotonic()
        assert idle.sample(0.0, {0: tree_reading(parent.pid)}) is None
        time.sleep(1.0)
        # one look is one moment: on a loaded machine a sleeper just woken may still wait for a
        # core (state R); a watch looks again, and so does this
        for _ in range(20):
            got = tree_reading(parent.pid)
            if got is None or got[0] is False:
                break
            time.sleep(0.05)
        assert got is not None and got[0] is False
        assert idle.sample(time.monotonic() - t0, {0: got}) == 0.0  # asleep, both of them
        flag.write_text("")
        time.sleep(1.0)
        busy = tree_reading(parent.pid)
        # the child's CPU counts as the rank's (a loaded machine gives it less than a core)
        assert busy is not None and busy[1] >= got[1] + 10
        assert idle.sample(time.monotonic() - t0, {0: busy}) is None
    finally:
        subprocess.run(["pkill", "-9", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
    assert tree_reading(parent.pid) is None


def test_a_job_host_learns_the_typical_step_from_the_records_own_times(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent.jobhost import RankProgress

    m = tmp_path / "metrics"
    m.mkdir()
    p = RankProgress(str(m))
    _lines(m / "rank-0.jsonl", *({"step": s, "time": 100.0 + 0.3 * s} for s in range(1, 6)))
    _lines(m / "rank-1.jsonl", {"step": 1, "time": 100.0}, {"step": 2, "time": 102.0}, {"step": 2, "time": 103.0})
    p.read()
    assert len(p.intervals) == 5 and hangrule.typical(p.intervals) == pytest.approx(0.3)

"""verify.run.progress: run events -> one count that only grows, steps x modes plus start-up and judging."""

from __future__ import annotations

from moe_overlap.verify.run.progress import START_UNITS, ProgressTracker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run_events(modes: list[str], steps: int) -> list[dict]:
    events = [{"event": "start", "modes": modes, "steps": steps, "nproc": 2}, {"event": "ranks"},
              {"event": "init", "backend": "gloo"}]
    events += [{"event": "mode", "mode": m} for m in modes]
    for s in range(1, steps + 1):  # the modes interleave, step by step
        events += [{"event": "step", "mode": m, "step": s, "steps": steps, "loss": 1.0 / s} for m in modes]
    return events + [{"event": "judge"}, {"event": "done", "verdict": "passed"}]


def test_every_event_is_one_unit_and_the_last_is_the_total():
    modes, steps = ["baseline", "overlap", "overlap+wgrad"], 6
    tracker = ProgressTracker(clock=Clock())
    values = [tracker.feed(e).done for e in _run_events(modes, steps)]
    total = START_UNITS + len(modes) * (1 + steps) + 2
    assert values == list(range(1, total + 1)) and tracker.current.total == total
    assert tracker.current.phase == "done" and tracker.current.message == "verdict: passed"


def test_interleaved_steps_are_counted_in_order_not_per_mode_blocks():
    tracker = ProgressTracker(clock=Clock())
    for e in _run_events(["baseline", "overlap"], 3)[:5]:
        tracker.feed(e)
    first = tracker.feed({"event": "step", "mode": "baseline", "step": 1, "loss": 2.0})
    second = tracker.feed({"event": "step", "mode": "overlap", "step": 1, "loss": 2.0})
    assert (first.done, second.done) == (6, 7) and "step 1/3 of mode overlap, loss 2.0000" == second.message


def test_repeated_or_late_events_never_move_it_back():
    tracker = ProgressTracker(clock=Clock())
    events = _run_events(["baseline", "overlap"], 2)
    for e in events[:6]:
        tracker.feed(e)
    before = tracker.current.done
    # A relaunch after a lost port race repeats the start-up events: ignored.
    assert tracker.feed({"event": "ranks"}) is None and tracker.feed({"event": "mode", "mode": "baseline"}) is None
    assert tracker.feed({"event": "unknown"}) is None
    assert tracker.current.done == before


def test_ticks_move_within_the_unit_saying_what_runs_and_stop_short_of_the_next():
    clock = Clock()
    tracker = ProgressTracker(clock=clock)
    tracker.feed({"event": "start", "modes": ["baseline"], "steps": 2, "nproc": 2})
    tracker.feed({"event": "ranks"})
    assert tracker.tick() is None  # too soon after the event
    seen = []
    for _ in range(120):  # two minutes of torch import
        clock.now += 1.0
        if (p := tracker.tick()) is not None:
            seen.append(p)
    assert seen and all(2 < p.done < 3 for p in seen)
    assert [p.done for p in seen] == sorted({p.done for p in seen})
    assert seen[0].message.startswith("importing torch")
    assert tracker.feed({"event": "init", "backend": "gloo"}).done == 3  # the next unit is still above
    assert [p.done for p in tracker.since(2.5)] == [p.done for p in tracker.history if p.done > 2.5]


def test_extra_steps_grow_the_total_and_the_count():
    tracker = ProgressTracker(clock=Clock())
    for e in _run_events(["baseline", "overlap"], 2)[:-2]:
        tracker.feed(e)
    before = tracker.current
    extra = tracker.feed({"event": "step", "mode": "baseline", "step": 3, "loss": 0.5})
    assert extra.done == before.done + 1 and extra.total == before.total + 2
    assert extra.message.startswith("extra step 3")
    assert tracker.feed({"event": "done", "verdict": "passed"}).done == extra.total

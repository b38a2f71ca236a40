"""`async.tasks_in_flight = "auto"`: the arithmetic of tasks in flight sized by the learner's pace."""

from __future__ import annotations

import pytest

from rlfarm.trainer.pace import InFlightPace


def test_the_window_is_the_farm_until_results_are_measured():
    pace = InFlightPace(cap=14)
    assert pace.window == 14
    assert pace.observe(results=0, task_seconds=9.0, busy_seconds=1.0) == 14  # nothing measured


def test_a_learner_slower_than_a_task_keeps_one_task_in_flight():
    """2 cores, a CNN's learner: a result takes the trainer longer than a task takes to act."""
    pace = InFlightPace(cap=2)
    for _ in range(5):
        pace.observe(results=2, task_seconds=0.5, busy_seconds=1.4)  # 0.7 s a result
    assert pace.window == 1


def test_a_fast_learner_keeps_every_worker_busy():
    pace = InFlightPace(cap=14)
    pace.observe(results=20, task_seconds=1.3, busy_seconds=1.0)  # 0.05 s a result: 26 would fit
    assert pace.window == 14


def test_the_window_is_what_keeps_the_learner_fed():
    """Tasks of 1 s, 0.25 s of the trainer's a result: 4 tasks deliver one result per learner step."""
    pace = InFlightPace(cap=14, smoothing=1.0)
    assert pace.observe(results=4, task_seconds=1.0, busy_seconds=1.0) == 4
    assert pace.observe(results=4, task_seconds=1.1, busy_seconds=1.0) == 5  # rounded up: never short


def test_the_figures_are_smoothed_so_one_odd_interval_does_not_swing_the_window():
    pace = InFlightPace(cap=14, smoothing=0.3)
    for _ in range(20):
        pace.observe(results=4, task_seconds=1.0, busy_seconds=1.0)
    assert pace.window == 4
    pace.observe(results=1, task_seconds=1.0, busy_seconds=1.0)  # one slow update: 1 s a result
    assert pace.window in (2, 3, 4) and pace.window > 1
    assert pace.busy_seconds == pytest.approx(0.25 + 0.3 * 0.75)


def test_a_trainer_that_never_computes_keeps_the_farm():
    pace = InFlightPace(cap=3)
    assert pace.observe(results=5, task_seconds=1.0, busy_seconds=0.0) == 3


@pytest.mark.parametrize("cap, smoothing", [(0, 0.3), (2, 0.0), (2, 1.5)])
def test_bad_arguments_are_refused(cap, smoothing):
    with pytest.raises(ValueError):
        InFlightPace(cap=cap, smoothing=smoothing)


@pytest.mark.parametrize("bound", [1, 4, 48])
def test_the_lag_bound_learns_at_the_bound_and_drops_past_it(bound):
    """The edge of async.max_policy_lag: a bound moved off by one passed every farm test, whose lags
    were far past it (issue 50)."""
    from rlfarm.trainer.policy_lag import too_stale

    assert not too_stale(0, bound) and not too_stale(bound, bound)
    assert too_stale(bound + 1, bound)


def test_each_policys_line_is_bounded_by_what_acted_as_the_run_version_is():
    """Several policies: a result whose run version is fresh but whose line version of one policy was
    held back (a worker that read a forged or stale pointer) is dropped at max + 1 on that line, and
    one whose line versions are not versions of each line is dropped (issue 50)."""
    from rlfarm.trainer.policy_lag import line_lags, stale_result

    heads = {"adversary": 40, "agent": 12}
    assert line_lags(None, heads) == {} and line_lags({}, heads) == {}  # one policy: nothing to say
    assert line_lags({"adversary": 39, "agent": 8}, heads) == {"adversary": 1, "agent": 4}
    assert line_lags({"adversary": 0, "agent": 12}, heads) == {"adversary": 40, "agent": 0}  # the edges
    assert not stale_result(1, line_lags({"adversary": 39, "agent": 8}, heads), 4)  # at the bound
    assert stale_result(1, line_lags({"adversary": 39, "agent": 7}, heads), 4)  # max + 1 on one line
    assert stale_result(5, {"adversary": 0, "agent": 0}, 4) and not stale_result(4, {}, 4)  # the run's
    # a line missing, not a number, newer than the head, negative, a bool
    for agent in (None, "8", 13, -1, True):
        assert line_lags({"adversary": 39, **({} if agent is None else {"agent": agent})}, heads) is None
    assert line_lags({"adversary": 41, "agent": 8}, heads) is None
    assert stale_result(0, None, 4)


@pytest.mark.unit
def test_the_lag_book_keeps_an_interval_and_the_runs_histogram():
    from rlfarm.trainer.policy_lag import LagBook

    book = LagBook()
    assert book.scalars()["farm/policy_lag"] == 0.0  # no result this interval: 0, every row has the columns
    book.record(2, 1, {"agent": 3})
    book.record(4, 4, None)  # what acted could not be read: the run's lag still counts
    s = book.scalars()
    assert (s["farm/policy_lag"], s["farm/policy_lag_min"], s["farm/policy_lag_max"]) == (3.0, 2, 4)
    assert s["farm/policy_lag_end"] == 2.5 and s["agent/policy_lag"] == 3.0
    book.reset()
    assert book.lags == [] and "agent/policy_lag" not in book.scalars()
    assert book.histogram() == {"2": 1, "4": 1}  # the run's, across intervals
    again = LagBook()
    again.restore(book.histogram())
    assert again.counts == {2: 1, 4: 1}


@pytest.mark.unit
def test_slot_wait_is_a_share_of_the_intervals_slot_time_and_of_the_runs():
    from rlfarm.trainer.policy_lag import SlotWait

    wait = SlotWait()
    assert wait.fraction(4, 0.0) == 0.0 and wait.run_fraction() == 0.0
    wait.waited(2.0)
    assert wait.fraction(4, 2.0) == 0.25  # 2 of 8 slot seconds
    assert wait.fraction(1, 1.0) == 1.0  # never above all of it
    wait.close_interval(4, 2.0)
    wait.interval = 0.0
    wait.waited(1.0)
    wait.close_interval(4, 2.0)
    assert wait.run_fraction() == round(3.0 / 16.0, 4)

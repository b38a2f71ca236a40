"""The evaluation bookkeeping (rlfarm.evaluation.bookkeeping.Evaluations) on its own: no Redis, no
processes. Each test feeds evaluation results in and checks the decisions the trainer would carry out
(send, record, write the best policy, unpin) and the versions that must stay pinned."""

from __future__ import annotations

import json
import math

import pytest

from rlfarm.config import from_flat
from rlfarm.evaluation.bookkeeping import CONFIRM_SEED, EVAL_SEED, Evaluations, Record, Send, Unpin, WriteBest

TARGET = 475.0


def evaluations(**overrides) -> Evaluations:
    return Evaluations(from_flat({"run_id": "ev", "seed": 7, "target_return": TARGET, "eval.interval": 1000,
                                  "eval.episodes": 10, "eval.tasks": 2, "eval.confirm_episodes": 20,
                                  **overrides}))


def finish(evals: Evaluations, send: Send, returns: list[float], env_steps: int = 0) -> list:
    """Hand in the results of `send`'s tasks, `returns` split evenly over them; the last call's decisions."""
    per_task = len(returns) // len(send.tasks)
    decisions: list = []
    for i, spec in enumerate(send.tasks):
        decisions = evals.received(spec.iteration, returns[i * per_task:(i + 1) * per_task], env_steps)
        if i < len(send.tasks) - 1:
            assert decisions == []  # nothing is decided before every task of the evaluation is in
    return decisions


def test_an_evaluation_sends_its_tasks_and_pins_its_version_while_they_run():
    evals = evaluations()
    send = evals.start(version=4, env_steps=1000)
    assert send.version == 4 and len(send.tasks) == 2
    assert [(s.run, s.kind, s.iteration, s.index, s.version, s.seed, s.episodes) for s in send.tasks] == [
        ("ev", "eval", 0, 0, 4, 7 + EVAL_SEED, 5), ("ev", "eval", 0, 1, 4, 7 + EVAL_SEED, 5)]
    assert evals.pinned() == {4}
    assert evals.start(version=5, env_steps=2000).tasks[0].iteration == 1  # numbers are never reused


def test_an_evaluation_below_the_target_is_recorded_and_becomes_the_best_without_a_confirmation():
    evals = evaluations()
    decisions = finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 6 + [200.0] * 4, env_steps=1500)
    assert decisions == [Record(1000, [100.0] * 6 + [200.0] * 4, 0), WriteBest(0, 140.0)]
    assert evals.mean_return == 140.0 and evals.best_version == 0 and evals.best_mean_return == 140.0
    assert not evals.target_reached and evals.awaiting == {} and evals.in_flight == {}
    assert evals.pinned() == {0}  # the best stays pinned

    # A worse one is recorded and its version let go; the best is unchanged.
    assert finish(evals, evals.start(version=1, env_steps=2000), [50.0] * 10) == [
        Record(2000, [50.0] * 10, 1), Unpin(1)]
    assert evals.best_version == 0 and evals.mean_return == 50.0 and evals.pinned() == {0}


def test_an_evaluation_at_the_target_asks_for_a_confirmation_of_the_same_version():
    evals = evaluations()
    decisions = finish(evals, evals.start(version=3, env_steps=1000), [500.0] * 10, env_steps=1800)
    assert len(decisions) == 2 and decisions[0] == Record(1000, [500.0] * 10, 3)
    confirm = decisions[1]
    assert isinstance(confirm, Send) and confirm.version == 3
    assert [(s.iteration, s.index, s.version, s.seed, s.episodes) for s in confirm.tasks] == [
        (1, 0, 3, 7 + CONFIRM_SEED, 10), (1, 1, 3, 7 + CONFIRM_SEED, 10)]
    assert not evals.target_reached  # one lucky evaluation is not enough on its own
    assert evals.best_version is None  # not settled until the confirmation is in
    assert evals.awaiting == {3: [500.0] * 10} and evals.pinned() == {3}
    assert evals.in_flight[1].confirm and evals.in_flight[1].env_steps == 1800  # logged when it was sent
    assert evals.mean_return == 500.0


def test_a_confirmation_that_agrees_reaches_the_target_and_scores_all_the_episodes():
    evals = evaluations()
    confirm = finish(evals, evals.start(version=3, env_steps=1000), [490.0] * 10, env_steps=1800)[1]
    decisions = finish(evals, confirm, [480.0] * 20)
    score = (4900 + 9600) / 30
    assert decisions == [Record(1800, [480.0] * 20, 3, confirmation=True), WriteBest(3, pytest.approx(score))]
    assert evals.target_reached and evals.best_version == 3
    assert evals.best_mean_return == pytest.approx(score)
    assert evals.mean_return == 490.0  # a confirmation is not "the last evaluation"
    assert evals.awaiting == {} and evals.pinned() == {3}


def test_a_confirmation_that_disagrees_does_not_reach_the_target_but_the_version_may_still_be_best():
    evals = evaluations()
    confirm = finish(evals, evals.start(version=0, env_steps=1000), [500.0] * 10)[1]
    decisions = finish(evals, confirm, [100.0] * 20)
    score = (5000 + 2000) / 30
    assert decisions == [Record(0, [100.0] * 20, 0, confirmation=True), WriteBest(0, pytest.approx(score))]
    assert not evals.target_reached
    assert evals.best_version == 0 and evals.best_mean_return == pytest.approx(score)


def test_a_new_best_is_kept_pinned_and_the_previous_best_released():
    evals = evaluations(**{"eval.confirm_episodes": 0})
    finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 10)
    decisions = finish(evals, evals.start(version=3, env_steps=4000), [300.0] * 10)
    assert decisions == [Record(4000, [300.0] * 10, 3), WriteBest(3, 300.0), Unpin(0)]
    assert evals.best_version == 3 and evals.pinned() == {3}


def test_versions_being_evaluated_or_awaiting_a_confirmation_stay_pinned():
    evals = evaluations()
    finish(evals, evals.start(version=0, env_steps=1000), [300.0] * 10)  # v0 best
    again = evals.start(version=0, env_steps=1500)  # v0 evaluated again, still in flight
    first = evals.start(version=2, env_steps=2000)
    second = evals.start(version=2, env_steps=2500)
    assert evals.pinned() == {0, 2}
    # v2 beats v0, but v0 has an evaluation in flight: it is not released.
    assert finish(evals, first, [400.0] * 10) == [Record(2000, [400.0] * 10, 2), WriteBest(2, 400.0)]
    assert evals.pinned() == {0, 2}
    # Worse than the best, v0's last evaluation ends: released now.
    assert finish(evals, again, [10.0] * 10) == [Record(1500, [10.0] * 10, 0), Unpin(0)]
    # The best is never released, whatever its later evaluations score.
    assert finish(evals, second, [10.0] * 10) == [Record(2500, [10.0] * 10, 2)]
    assert evals.pinned() == {2}

    # A version awaiting its confirmation stays pinned though none of its tasks is in flight.
    evals = evaluations()
    finish(evals, evals.start(version=5, env_steps=1000), [500.0] * 10)  # at the target: confirmation out
    evals.in_flight.clear()  # (as if the confirmation's tasks were lost)
    assert evals.pinned() == {5}


def test_without_confirmation_episodes_the_first_evaluation_at_the_target_decides():
    evals = evaluations(**{"eval.confirm_episodes": 0})
    decisions = finish(evals, evals.start(version=2, env_steps=1000), [500.0] * 10)
    assert decisions == [Record(1000, [500.0] * 10, 2), WriteBest(2, 500.0)]
    assert evals.target_reached and evals.awaiting == {} and evals.in_flight == {}


def test_the_schedule_evaluates_once_per_interval_and_the_final_policy_once():
    evals = evaluations()
    assert evals.due(env_steps=999, version=0) == []
    [send] = evals.due(env_steps=3500, version=2)  # three intervals passed: one evaluation
    assert send.version == 2 and evals.next_eval == 4000
    assert evals.due(env_steps=3900, version=3) == []
    assert evals.final(env_steps=3900, version=2) == []  # the final policy was just evaluated
    [final] = evals.final(env_steps=3900, version=3)
    assert final.version == 3 and final.tasks[0].iteration == 1



def test_without_an_interval_only_the_final_policy_is_evaluated_and_never_confirmed():
    """eval.interval = 0 (the Atari presets): nothing on a schedule, but the final policy is evaluated
    and kept as the best policy. The target is then the rolling training return's, so an evaluation at
    it asks for no confirmation episodes."""
    evals = evaluations(**{"eval.interval": 0})
    assert evals.due(env_steps=10**6, version=9) == []
    [final] = evals.final(env_steps=10**6, version=9)
    assert final.version == 9 and len(final.tasks) == 2 and evals.pinned() == {9}
    decisions = finish(evals, final, [500.0] * 10, env_steps=10**6)
    assert decisions == [Record(10**6, [500.0] * 10, 9), WriteBest(9, 500.0)]
    assert evals.best_version == 9 and evals.in_flight == {} and evals.awaiting == {}
    assert evals.final(env_steps=10**6, version=9) == []  # evaluated already


def test_state_round_trips_through_the_trainer_checkpoint_with_the_same_keys():
    evals = evaluations()
    finish(evals, evals.start(version=0, env_steps=1000), [100.0] * 10)
    evals.due(env_steps=1000, version=0)
    finish(evals, evals.start(version=4, env_steps=5000), [500.0] * 10)  # a confirmation in flight
    state = evals.state()
    assert state == {"next_eval": 2000, "eval_counter": 4, "eval_mean_return": 500.0,
                     "best_eval_mean_return": 100.0, "best_version": 0, "target_reached": False}

    resumed = evaluations()
    # As rlfarm.trainer.resume stores it: inside the checkpoint's JSON state, beside the trainer's keys.
    checkpoint = json.loads(json.dumps({"run_id": "ev", "env_steps": 5000, "version": 5, **state}))
    resumed.restore(checkpoint, task_offset=1_000_000)
    assert resumed.state() == {**state, "eval_counter": 1_000_004}
    assert resumed.best_version == 0 and resumed.pinned() == {0}  # evaluations in flight died with the trainer
    assert resumed.start(version=5, env_steps=5000).tasks[0].iteration == 1_000_004

    fresh = evaluations()  # before any evaluation: NaN and -inf survive the JSON round trip
    again = evaluations()
    again.restore(json.loads(json.dumps(fresh.state())))
    assert math.isnan(again.mean_return) and again.best_mean_return == -math.inf
    assert again.best_version is None and not again.target_reached

    old = {k: v for k, v in state.items() if k not in ("best_version", "target_reached")}
    older = evaluations()  # a checkpoint written before these keys existed
    older.restore(old)
    assert older.best_version is None and older.target_reached is False and older.counter == 4


def test_the_trainer_waits_for_the_final_evaluation_even_while_it_is_held_back_for_the_runs_share():
    """On a shared farm the final evaluation's tasks may still be held in the trainer (its share is
    full) when the loop ends: the run waits for them rather than ending without its evaluation, and
    a rollout that arrives meanwhile (ASYNC) is unused."""
    from rlfarm.core.protocol import Result, TaskSpec
    from rlfarm.trainer.base import Trainer

    spec = TaskSpec("ev", "eval", 3, 0, 5, 7, episodes=5)
    arrivals = [None, Result("rollout", 9, 0, task_id="late"), Result("eval", 3, 0, returns=[1.0])]

    class SharedFarm:  # the task channel's side the drain uses: its held task is sent on the 1st call
        held, pending = [spec], {}

        def outstanding(self, kind):
            return sum(1 for s in [*self.held, *self.pending.values()] if s.kind == kind)

        def next_result(self, timeout):
            if self.held:
                self.pending[spec.key] = self.held.pop()
            message = arrivals.pop(0)
            if message is not None and message.kind == "eval":
                del self.pending[spec.key]
            return message

    trainer = Trainer.__new__(Trainer)
    trainer.channel = SharedFarm()
    handled, unused = [], []
    trainer.handle_eval, trainer.unused_result = handled.append, unused.append
    trainer.drain_evaluations()
    assert [m.kind for m in handled] == ["eval"] and [m.task_id for m in unused] == ["late"]
    assert arrivals == []

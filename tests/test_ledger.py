"""The one owner of pending tasks (rlfarm.trainer.ledger), what a copy came back as (Result.outcome),
and the one table of exit statuses (rlfarm.cli.common.exit_code)."""

from __future__ import annotations

import dataclasses

import pytest

from rlfarm import errors as E
from rlfarm.cli.common import exit_code
from rlfarm.core.protocol import Outcome, Result, TaskSpec
from rlfarm.trainer.ledger import Pending, TaskLedger

pytestmark = pytest.mark.unit


def spec(index: int, kind: str = "rollout") -> TaskSpec:
    return TaskSpec("r", kind, 3, index, 0, 1, steps=8)


def test_a_pending_task_changes_only_through_the_ledger():
    ledger = TaskLedger()
    ledger.open(spec(0), "id0", 5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ledger[spec(0).key].started = 6.0  # type: ignore[misc]


def test_opening_into_an_empty_ledger_starts_the_wait_for_a_finished_task():
    ledger = TaskLedger()
    ledger.open(spec(0), "id0", 5.0)
    assert ledger.last_finish == 5.0
    ledger.open(spec(1), "id1", 7.0)  # one was already out: the wait goes on
    assert ledger.last_finish == 5.0
    assert len(ledger) == 2 and spec(1).key in ledger and list(ledger) == [spec(0).key, spec(1).key]
    assert ledger[spec(1).key] == Pending(spec(1), "id1", 7.0, sent=7.0)


def test_copies_count_towards_max_redispatch_only_when_counted_and_backups_restart_the_clock():
    ledger = TaskLedger()
    key = spec(0).key
    ledger.open(spec(0), "id0", 0.0)
    ledger.refused_unrun(key, 1.0)
    p = ledger.copied(key, "id1", "lost", backup=False, counted=True, now=2.0)
    assert (p.task_id, p.copies, p.backups, p.started, p.refused, p.sent, p.reason) == (
        "id1",
        2,
        0,
        None,
        None,
        2.0,
        "lost",
    )
    p = ledger.copied(key, "id2", "refused", backup=False, counted=False, now=3.0)
    assert p.copies == 2
    p = ledger.copied(key, "id3", "straggling", backup=True, counted=True, now=4.0)
    assert (p.copies, p.backups, p.started) == (3, 1, 4.0)


def test_leases_lease_gaps_and_the_wanted_set_as_the_watchdog_sees_them():
    ledger = TaskLedger()
    key = spec(0).key
    ledger.open(spec(0), "id0", 0.0)
    assert ledger.leased(key, 1.0).started == 1.0
    assert ledger.leased(key, 2.0).started == 1.0  # started when first seen leased
    assert ledger.lease_missing(key, 3.0) == 3.0
    assert ledger.lease_missing(key, 4.0) == 3.0  # missing since the first look
    assert ledger.leased(key, 5.0).lease_gone is None
    assert ledger.unwanted(key, 6.0).unwanted_since == 6.0
    assert ledger.unwanted(key, 7.0).unwanted_since == 6.0
    assert ledger.unwanted(key, None).unwanted_since is None
    assert ledger.refusal(key) == 1 and ledger.refusal(key) == 2
    ledger.all_seen(9.0)
    assert ledger[key].last_seen == 9.0


def test_settling_removes_the_task_and_learns_its_duration():
    ledger = TaskLedger()
    ledger.open(spec(0), "id0", 0.0)
    ledger.open(spec(1, "eval"), "id1", 0.0)
    ledger.settle(spec(0).key, 2.5, 10.0)
    ledger.settle(spec(1, "eval").key, None, 11.0)
    assert not ledger and ledger.last_finish == 11.0 and ledger.longest == {"rollout": 2.5}
    assert ledger.count() == ledger.count("rollout") == 0


@pytest.mark.parametrize(
    "fields, outcome",
    [
        ({}, Outcome.RESULT),
        ({"skipped": True}, Outcome.SKIPPED),
        ({"handed_back": True, "error": "HandedBack: w"}, Outcome.HANDED_BACK),
        ({"refused": True, "protocol": 8, "error": "ProtocolMismatch: w"}, Outcome.REFUSED),
        ({"unverified": "policy", "error": "SignatureError: p"}, Outcome.UNVERIFIED),
        ({"unverified": "elsewhere", "error": "x"}, Outcome.FAILED),  # not an input a worker checks
        ({"error": "RuntimeError: boom"}, Outcome.FAILED),
        ({"error": "TimeLimitExceeded: 60", "retryable": True}, Outcome.FAILED),
    ],
)
def test_a_copy_comes_back_as_exactly_one_outcome(fields, outcome):
    result = Result("rollout", 1, 0, **fields)
    assert result.outcome is outcome
    assert Result.from_message(result.to_message()).outcome is outcome  # decided by what travels


@pytest.mark.parametrize(
    "error, code",
    [
        (E.ConfigError("bad key"), 2),
        (E.VideoError("no frames"), 2),
        (E.VideoPackageMissing("pip install moviepy"), 1),  # the most specific class decides
        (E.EnvError("unknown env"), 2),
        (E.RedisAuthError("wrong password"), 2),  # a ConnectionError, but a usage error
        (ConnectionRefusedError("unreachable"), 1),
        (E.RolloutError("failed"), 1),
        (E.RunInUse("taken"), 1),
        (ValueError("a bug"), None),
    ],
)
def test_one_table_gives_each_error_its_exit_status(error, code):
    assert exit_code(error) == code


def test_a_tasks_collect_options_are_typed_and_the_rest_of_act_acts():
    from rlfarm.core.protocol import COLLECT_OPTIONS, CollectOptions

    task = TaskSpec(
        "r", "rollout", 1, 0, 0, 1, steps=8, act={"epsilon": 0.05, "keep_next_obs": True, "refresh_steps": 64}
    )
    assert task.collect == CollectOptions(keep_next_obs=True, refresh_steps=64, opponents=None)
    assert task.acting_options() == {"epsilon": 0.05}
    assert COLLECT_OPTIONS == ("keep_next_obs", "refresh_steps", "opponents")  # the wire's keys of `act`
    assert TaskSpec("r", "rollout", 1, 0, 0, 1, steps=8).collect == CollectOptions()


@pytest.mark.parametrize("algo", ["ppo", "dqn", "sac", "td3"])
def test_every_algorithms_acting_module_keeps_the_contract(algo):
    from rlfarm.algos.acting import ActingModule, acting_module

    module = acting_module(algo)
    assert isinstance(module, ActingModule) and isinstance(module.HEAD, str)


def test_a_module_that_breaks_the_acting_contract_is_named_with_what_it_lacks():
    import types

    from rlfarm.algos.acting import checked_acting

    half = types.ModuleType("rlfarm.algos.half.acting")
    half.HEAD = "actor"
    with pytest.raises(TypeError, match=r"rlfarm.algos.half.acting is no acting module: it lacks numpy_actor"):
        checked_acting(half)

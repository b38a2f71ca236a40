"""The watchdog's paths to the trainer that owns the run (rlfarm.trainer.watchdog, .outbox, .channel),
against a real redis-server (the session's `redis_only`) and a real Celery app, with no worker: the
tasks sent sit in the broker's queue in Redis, where they are counted. The trainer's side is a
recorder (`Owner`). Real farms meet the same paths in test_faults.py (FLUSHALL), test_forged_keys.py,
test_tamper.py (refused inputs) and test_sentinel.py (lost writes)."""

from __future__ import annotations

import logging

import pytest
import redis

from rlfarm.core import codec
from rlfarm.core.protocol import Result
from rlfarm.errors import RolloutError
from rlfarm.farm import keys
from rlfarm.farm.app import make_app
from rlfarm.farm.claim import Claim
from rlfarm.farm.connection import connect
from rlfarm.trainer.channel import FarmLink, TaskChannel
from rlfarm.trainer.dispatch import Unowned

pytestmark = pytest.mark.farm

SPEC = {"iteration": 0, "index": 0, "version": 0, "steps": 8, "seed": 1}
KEY = ("rollout", 0, 0)
TASK = keys.task(*KEY)


class Owner(Unowned):
    """The trainer's side: what it was asked, in order."""

    def __init__(self, repaired: str | None = "wrote back policy v0 from the trainer's own copy; "):
        self.asked: list[str] = []
        self.repaired = repaired

    def warn(self, text):
        self.asked.append(f"warn: {text}")

    def on_event(self):
        self.asked.append("on_event")

    def restore_run_state(self):
        self.asked.append("restore_run_state")

    def rewrite_owned(self):
        self.asked.append("rewrite_owned")

    def write_back(self, kind):
        self.asked.append(f"write_back {kind}")
        return self.repaired


@pytest.fixture
def link(redis_only, request):
    """FarmLinks to the session's Redis for run ids of this test's own (`link(suffix)`), all on one
    client and one Celery app. No worker consumes the broker queue: it is emptied before the test (what
    an earlier test left there is not this one's) and after it, with every key of the runs made."""
    client, app = connect(redis_only.redis_url), make_app(redis_only.redis_url)
    queue = app.conf.task_default_queue
    client.delete(queue)
    runs: list[str] = []

    def make(suffix: str = "") -> FarmLink:
        run = f"watchdog-{request.node.name}{suffix}"
        runs.append(run)
        return FarmLink(app, client, run, 60.0, 3, claim=Claim(client, run), secret=None)

    yield make
    for run in runs:
        doomed = list(client.scan_iter(match=keys.run_pattern(run), count=500))
        if doomed:
            client.delete(*doomed)
    client.delete(queue)
    app.close()
    client.close()


def open_channel(farm: FarmLink, owner: Owner | None) -> TaskChannel:
    channel = farm.open(owner)
    channel.submit(SPEC)
    return channel


def queued(farm: FarmLink) -> int:
    """Task messages in the broker queue: each one sent, none taken (no worker)."""
    return farm.client.llen(farm.app.conf.task_default_queue)


def wanted(farm: FarmLink) -> set[str]:
    return {m.decode() for m in farm.client.smembers(keys.wanted(farm.run_id))}


def bindings(farm: FarmLink) -> set[bytes]:
    """kombu's routing of task messages to the run's queue (`_kombu.binding.<exchange>` sets, and their
    `_kombu.binding_permanent.` twins): only this queue's, since other tests on the shared Redis make
    kombu keys of their own (`_kombu.binding_deadlines`) at any moment."""
    queue = farm.app.conf.task_default_queue.encode()
    return {key for key in farm.client.scan_iter(match="_kombu.binding*") if key.endswith(b"." + queue)}


def test_the_run_state_lost_and_a_forged_key_take_one_path_to_the_owner(link, caplog):
    owner = Owner()
    farm = link()
    channel = open_channel(farm, owner)
    client, run = farm.client, farm.run_id
    assert owner.asked == ["on_event"] and queued(farm) == 1 and wanted(farm) == {keys.LIVE, TASK}

    # The run's state gone as after a FLUSHALL: no run metadata (never written here), its wanted set
    # and the broker's routing deleted. The queue's message is kept, so that a re-send would show.
    routing = bindings(farm)
    assert routing
    client.delete(keys.wanted(run), *routing)
    channel.check(force=True)
    # The real declare_queue ran (no longer stubbed to record itself in `owner.asked`): the routing is
    # back in Redis.
    assert owner.asked[1:] == ["restore_run_state"] and bindings(farm) == routing
    assert channel.stats.state_restored == 1 and wanted(farm) == {keys.LIVE, TASK}  # re-listed

    client.set(keys.meta(run), b"meta")
    with caplog.at_level(logging.WARNING, logger="rlfarm.trainer"):
        channel.watchdog.refused.report(f"refused {keys.latest(run)}")  # as the store tells it
    assert channel.stats.forged_keys == 1 and f"refused {keys.latest(run)}" in caplog.text
    assert owner.asked[-1] == "restore_run_state"  # written back at the next check, not before
    client.srem(keys.wanted(run), TASK)  # the forger took the task out of `wanted` too
    channel.check(force=True)
    assert owner.asked[2:] == ["rewrite_owned"] and wanted(farm) == {keys.LIVE, TASK}  # re-listed
    assert channel.stats.state_restored == 1 and not channel.watchdog.refused.due
    channel.check(force=True)
    # A lease period's grace: nothing judged yet, nothing sent again.
    assert owner.asked[3:] == [] and queued(farm) == 1 and channel.stats.dispatched == 1


def _refusal(client: redis.Redis, run: str, task_id: str) -> None:
    """A worker's signed report that the task's policy did not verify, pushed as workers push results."""
    client.rpush(
        keys.results(run),
        codec.pack(
            Result(
                "rollout",
                0,
                0,
                task_id=task_id,
                worker="w:1",
                error="PolicyCorrupt: policy blob is not signed",
                unverified="policy",
            ).to_message()
        ),
    )


def test_a_refused_input_is_written_back_by_the_owner_and_its_task_sent_again_uncounted(link):
    owner = Owner()
    farm = link()
    channel = open_channel(farm, owner)
    first = channel.pending[KEY].task_id
    farm.client.set(keys.meta(farm.run_id), b"meta")
    _refusal(farm.client, farm.run_id, first)
    assert channel.next_result(timeout=0.1) is None
    assert owner.asked[1] == "write_back policy" and owner.asked[2].endswith(
        "wrote back policy v0 from the trainer's own copy; sending it again"
    )
    pending = channel.pending[KEY]
    assert queued(farm) == 2 and pending.task_id != first  # a second copy sent, pending as that one
    assert channel.watchdog.queued_task_ids() == {first, pending.task_id}
    assert pending.copies == 1 and pending.refusals == 1
    assert channel.stats.unverified["policy"] == 1 and channel.stats.redispatched == 1


def test_a_refused_input_fails_the_task_when_nobody_holds_a_copy(link):
    for i, owner in enumerate((Owner(repaired=None), None)):
        farm = link(f"-{i}")
        channel = open_channel(farm, owner)
        farm.client.set(keys.meta(farm.run_id), b"meta")
        _refusal(farm.client, farm.run_id, channel.pending[KEY].task_id)
        with pytest.raises(
            RolloutError,
            match=r"task rollout \(iteration 0, index 0\) failed on w:1: "
            "PolicyCorrupt",
        ):
            channel.next_result(timeout=0.1)
        assert queued(farm) == 1  # not sent again
        farm.client.delete(farm.app.conf.task_default_queue)  # the next owner's run counts from none


def test_a_fault_its_env_named_is_sent_again_counted_by_name_and_an_odd_name_as_unnamed(link):
    """rlfarm.errors.EnvFault's report: re-sent, counted towards max_redispatch, counted by its name;
    a name that could not be an EnvFault's (a report someone else pushed) is counted as "unnamed"."""
    farm = link()
    channel = open_channel(farm, Owner())
    farm.client.set(keys.meta(farm.run_id), b"meta")
    for name in ("simulator_crash", "Not a name!"):
        report = Result("rollout", 0, 0, task_id=channel.pending[KEY].task_id, worker="w:1", error=f"EnvFault: {name}")
        report.retryable, report.fault = True, name
        farm.client.rpush(keys.results(farm.run_id), codec.pack(report.to_message()))
        assert channel.next_result(timeout=0.1) is None
    assert channel.stats.reported == {"simulator_crash": 1, "unnamed": 1}
    assert channel.stats.time_limits == 0 and channel.stats.redispatched == 2 and queued(farm) == 3

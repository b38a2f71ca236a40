"""The watchdog's paths to the trainer that owns the run (rlfarm.trainer.watchdog, .outbox, .channel),
with Redis and the Celery app faked: no process. Real farms meet the same paths in test_faults.py
(FLUSHALL), test_forged_keys.py, test_tamper.py (refused inputs) and test_sentinel.py (lost writes)."""

from __future__ import annotations

import logging
from collections import defaultdict
from types import SimpleNamespace

import pytest

from rlfarm.core import codec
from rlfarm.core.protocol import Result
from rlfarm.farm import keys
from rlfarm.farm.claim import Claim
from rlfarm.trainer.channel import FarmLink
from rlfarm.trainer.outbox import RolloutError, Unowned


class FakeRedis:
    """The commands the channel and the watchdog send, on dicts."""

    def __init__(self):
        self.strings: dict[str, bytes] = {}
        self.sets: dict[str, set] = defaultdict(set)
        self.lists: dict[str, list] = defaultdict(list)
        self.sadds: list[set] = []

    def sadd(self, key, *members):
        self.sadds.append(set(members))
        self.sets[key].update(members)

    def exists(self, key):
        return int(key in self.strings)

    def lrange(self, key, start, end):
        return list(self.lists[key])

    def lpop(self, key):
        return self.lists[key].pop(0) if self.lists[key] else None

    def blpop(self, names, timeout):
        raw = self.lpop(names[0])
        return None if raw is None else (names[0], raw)

    def pipeline(self, transaction=True):
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, redis):
        self.redis, self.answers = redis, []

    def exists(self, key):
        self.answers.append(lambda: self.redis.exists(key))

    def llen(self, key):
        self.answers.append(lambda: len(self.redis.lists[key]))

    def smismember(self, key, members):
        self.answers.append(lambda: [int(m in self.redis.sets[key]) for m in members])

    def get(self, key):
        self.answers.append(lambda: self.redis.strings.get(key))

    def execute(self):
        return [answer() for answer in self.answers]


class FakeApp:
    conf = SimpleNamespace(task_default_queue="queue")

    def __init__(self):
        self.sent: list[dict] = []

    def send_task(self, name, kwargs, kwargsrepr, time_limit):
        self.sent.append(kwargs)
        return SimpleNamespace(id=f"id{len(self.sent)}")


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


def open_channel(owner=None):
    client, app = FakeRedis(), FakeApp()
    channel = FarmLink(app, client, "r", 60.0, 3, claim=Claim(client, "r"), secret=None).open(owner)
    channel.outbox.declare_queue = lambda: owner.asked.append("declare_queue")  # the broker's routing
    channel.submit({"iteration": 0, "index": 0, "version": 0, "steps": 8, "seed": 1})
    return channel, client, app


def test_the_run_state_lost_and_a_forged_key_take_one_path_to_the_owner(caplog):
    owner = Owner()
    channel, client, app = open_channel(owner)
    task = keys.task("rollout", 0, 0)
    assert owner.asked == ["on_event"] and len(app.sent) == 1 and client.sadds == [{keys.LIVE, task}]

    channel.check(force=True)  # no run metadata in Redis: its state is gone (FLUSHALL)
    assert owner.asked[1:] == ["declare_queue", "restore_run_state"]
    assert channel.stats.state_restored == 1 and client.sadds[-1] == {keys.LIVE, task}  # re-listed

    client.strings[keys.meta("r")] = b"meta"
    with caplog.at_level(logging.WARNING, logger="rlfarm.trainer"):
        channel.watchdog.refused.report("refused rlfarm:r:policy:latest")  # as the store tells it
    assert channel.stats.forged_keys == 1 and "refused rlfarm:r:policy:latest" in caplog.text
    assert owner.asked[-1] == "restore_run_state"  # written back at the next check, not before
    channel.check(force=True)
    assert owner.asked[3:] == ["rewrite_owned"] and client.sadds[-1] == {keys.LIVE, task}
    assert channel.stats.state_restored == 1 and not channel.watchdog.refused.due
    channel.check(force=True)
    assert owner.asked[4:] == [] and len(app.sent) == 1  # a lease period's grace: nothing judged yet


def _refusal(client, task_id):
    client.lists[keys.results("r")].append(codec.pack(Result(
        "rollout", 0, 0, task_id=task_id, worker="w:1", error="PolicyCorrupt: policy blob is not signed",
        unverified="policy").to_message()))


def test_a_refused_input_is_written_back_by_the_owner_and_its_task_sent_again_uncounted():
    owner = Owner()
    channel, client, app = open_channel(owner)
    client.strings[keys.meta("r")] = b"meta"
    _refusal(client, "id1")
    assert channel.next_result(timeout=0.1) is None
    assert owner.asked[1] == "write_back policy" and owner.asked[2].endswith(
        "wrote back policy v0 from the trainer's own copy; sending it again")
    pending = channel.pending[("rollout", 0, 0)]
    assert len(app.sent) == 2 and pending.task_id == "id2" and pending.copies == 1 and pending.refusals == 1
    assert channel.stats.unverified["policy"] == 1 and channel.stats.redispatched == 1


def test_a_refused_input_fails_the_task_when_nobody_holds_a_copy():
    for owner in (Owner(repaired=None), None):
        client, app = FakeRedis(), FakeApp()
        channel = FarmLink(app, client, "r", 60.0, 3, claim=Claim(client, "r"), secret=None).open(owner)
        channel.submit({"iteration": 0, "index": 0, "version": 0, "steps": 8, "seed": 1})
        client.strings[keys.meta("r")] = b"meta"
        _refusal(client, "id1")
        with pytest.raises(RolloutError, match=r"task rollout \(iteration 0, index 0\) failed on w:1: "
                                               "PolicyCorrupt"):
            channel.next_result(timeout=0.1)
        assert len(app.sent) == 1

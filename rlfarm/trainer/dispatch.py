"""What the trainer's two dispatch parts share: the tasks out, and the one way a copy of one is sent.

The task channel (rlfarm.trainer.channel) sends new tasks and takes their results in; the watchdog
(rlfarm.trainer.watchdog) judges whether the pending ones are alive and sends lost ones again. Both
work on one `Outbox`: every task sent stays pending under its key (kind, iteration, index) until its
first result is accepted, and is listed in the run's `wanted` set, which workers check before they
start. Both talk to the trainer through one `RunOwner`, which the trainer is; `RefusedKeys` is how
those made before the trainer (its outage clock's guard, the policy store, the claim) tell of keys
of the run written by someone else.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from kombu.exceptions import OperationalError

from rlfarm.core import signing
from rlfarm.core.protocol import Key, Result, TaskSpec
from rlfarm.farm import keys
from rlfarm.farm.claim import Claim
from rlfarm.farm.outage import OutageRetry
from rlfarm.farm.policies.store import FROM_ENV
from rlfarm.trainer.counters import DispatchStats
from rlfarm.trainer.ledger import TaskLedger
from rlfarm.trainer.log import warn

if TYPE_CHECKING:
    from celery import Celery

AUTO_TIME_LIMIT_FIRST = 600.0  # hard time limit before any task of a kind has reported its duration
AUTO_TIME_LIMIT_MIN = 60.0
AUTO_TIME_LIMIT_FACTOR = 10.0  # times the longest duration seen so far


class RunOwner(Protocol):
    """What the dispatch parts ask of the trainer that owns the run (rlfarm.trainer.base.Trainer)."""

    def warn(self, text: str) -> None:
        """A fault the run rides out, said."""

    def on_event(self) -> None:
        """A task was sent or a result accepted (the progress bar)."""

    def handle_eval(self, message: Result) -> None:
        """A result of a task outside the SYNC group being gathered: an evaluation's."""

    def restore_run_state(self) -> None:
        """The run's keys are gone from Redis (FLUSHALL, a restart without its data): write back what
        the trainer owns (metadata, policy versions, heartbeat)."""

    def rewrite_owned(self) -> None:
        """A key of the run was found as the trainer did not write it: write back what it owns."""

    def after_outage(self) -> None:
        """Redis is back after an outage, maybe as a replica that lacks the newest writes: put back
        the newest and pinned policy versions."""

    def write_back(self, kind: str) -> str | None:
        """A worker refused the run's "policy", "meta" or "spec" as not signed by the farm: put back
        what the trainer wrote and say what (None: nobody holds a genuine copy; the task fails)."""

    def accepted_snapshot(self, message: Result) -> None:
        """An accepted result: the env stream snapshot it names is the stream's next (not a late copy's)."""

    def late_copy(self, message: Result) -> None:
        """A copy of a task that already counted, or of an earlier trainer: what it left in Redis
        that no task will read (its env stream's snapshot) goes."""


class Unowned:
    """No trainer behind the dispatch (tests, benchmarks): nothing is said or written back, and a
    task whose input a worker refused as unsigned fails as any other error does."""

    def warn(self, text: str) -> None:
        pass

    def on_event(self) -> None:
        pass

    def handle_eval(self, message: Result) -> None:
        pass  # dropped: nobody evaluates

    def restore_run_state(self) -> None:
        pass

    def rewrite_owned(self) -> None:
        pass

    def after_outage(self) -> None:
        pass

    def write_back(self, kind: str) -> str | None:
        return None

    def accepted_snapshot(self, message: Result) -> None:
        pass

    def late_copy(self, message: Result) -> None:
        pass


class RefusedKeys:
    """Keys of the run found as the trainer did not write them (rlfarm.farm.guard, PolicyStore, Claim,
    and the watchdog's own look at `wanted`): each is counted in `stats` and said at once, and what
    the trainer owns is written back at the watchdog's next check (`due`). Made before the client,
    store and claim that report to it, so that none of them needs the watchdog or the trainer."""

    def __init__(self, stats: DispatchStats):
        self.stats = stats
        self.due = False

    def mark(self) -> None:
        self.stats.forged_keys += 1
        self.due = True

    def report(self, text: str) -> None:
        self.mark()
        warn(text)  # said as the trainer's warnings are


class Outbox:
    """How a copy of a task is sent: signed, labelled, with its hard time limit, through a Redis
    outage, and never before the run's claim is renewed after one. The tasks sent and not yet
    answered are its `ledger`'s (rlfarm.trainer.ledger), which the channel and the watchdog share."""

    def __init__(
        self,
        app: Celery,
        claim: Claim,
        *,
        own_claim: bool = False,
        env: str | None = None,
        time_limit: float = 0.0,
        retry: OutageRetry | None = None,
        secret: Any = FROM_ENV,
        stats: DispatchStats | None = None,
    ):
        """`claim`: the run's claim (rlfarm.farm.claim), whose incarnation every task carries; its client
        and run id are the outbox's. `own_claim`: the channel claims the run itself when it first sends
        a task (no trainer holds it). `time_limit`: hard limit in seconds on a task's run time on its
        worker (0: derived from the durations seen). `retry`: the outage clock of the claim's client,
        also applied to sending tasks."""
        self.app = app
        self.client = claim.client
        self.run_id = claim.run_id
        self.wanted = keys.wanted(self.run_id)
        self.env = env  # the run's env id, sent as a label for Flower (workers take it from the run)
        self.time_limit = time_limit
        self.retry = retry or OutageRetry()
        self.stats = stats if stats is not None else DispatchStats()
        self.ledger = TaskLedger()
        self.queue = app.conf.task_default_queue
        self.secret = signing.secret_from_env() if secret is FROM_ENV else secret  # signs specs, checks results
        self.own_claim = own_claim
        self.claim = claim
        self._claim_renewed_at = self.retry.outages  # outages after which the claim was renewed

    # ---- time limits -----------------------------------------------------------------------------
    def time_limit_for(self, kind: str) -> float:
        if self.time_limit > 0:
            return self.time_limit
        longest = self.ledger.longest
        if kind not in longest:
            return AUTO_TIME_LIMIT_FIRST
        return max(AUTO_TIME_LIMIT_MIN, AUTO_TIME_LIMIT_FACTOR * longest[kind])

    def describe_time_limit(self, kind: str) -> str:
        """The hard time limit a task of `kind` is sent with, and where it comes from."""
        limit = self.time_limit_for(kind)
        if self.time_limit > 0:
            source = "farm.task_time_limit"
        elif kind not in self.ledger.longest:
            source = f"farm.task_time_limit 0: {AUTO_TIME_LIMIT_FIRST:g} s until a {kind} task has finished"
        else:
            source = (
                f"farm.task_time_limit 0: {AUTO_TIME_LIMIT_FACTOR:g}x the longest {kind} task, "
                f"at least {AUTO_TIME_LIMIT_MIN:g} s"
            )
        return (
            f"a {kind} task is killed at its time limit of {limit:g} s ({source}; a worker's --time-limit may lower it)"
        )

    # ---- sending ---------------------------------------------------------------------------------
    def list_wanted(self, task_keys: list[Key]) -> None:
        """List tasks in the run's `wanted` set (a worker skips a task not listed there)."""
        self.client.sadd(self.wanted, keys.LIVE, *[keys.task(*k) for k in task_keys])

    def send(self, spec: TaskSpec) -> str:
        """Send one copy of `spec`; its Celery task id."""
        if self.env is not None:
            spec = dataclasses.replace(spec, env=self.env)
        spec = dataclasses.replace(spec, incarnation=self.claim.incarnation)  # workers run it while we live
        kwargs = signing.sign_spec(spec.to_kwargs(), self.secret)  # with RLFARM_SECRET: workers verify it
        limit = self.time_limit_for(spec.kind)

        def send() -> Any:
            self.renew_claim_after_outage()  # also when this very send is what waited the outage out
            # kwargsrepr is what Flower and worker events show: a short label instead of the dict repr.
            return self.app.send_task(spec.task_name, kwargs=kwargs, kwargsrepr=spec.label(), time_limit=limit)

        # Celery's publisher gives up after ~1 s of a Redis outage; the outage clock waits longer.
        result = self.retry.run(send, errors=(OperationalError,))
        self.stats.dispatched += 1
        self.stats.task_ids.setdefault(spec.key, []).append(result.id)
        return result.id

    def renew_claim_after_outage(self) -> None:
        """After a Redis outage (or during one, for a send being retried), renew the run's claim before
        any task is sent: an outage longer than CLAIM_SECONDS lets it lapse, workers skip tasks of a
        run whose claim is gone, and the claim's thread may still be in its back-off when Redis is
        back. ClaimLost if another trainer took the run meanwhile."""
        if self.retry.outages == self._claim_renewed_at and self.retry.outage_started is None:
            return
        if self.claim.held and not self.claim.renew():
            self.claim.check()
        self._claim_renewed_at = self.retry.outages

    def declare_queue(self) -> None:
        """(Re)create the broker's routing of task messages to the task queue. kombu keeps that
        binding in Redis and declares it once per connection: after a FLUSHALL every task sent would
        otherwise be routed nowhere, silently."""

        def declare() -> None:
            with self.app.connection_for_write() as conn:
                self.app.amqp.queues[self.queue](conn.default_channel).declare()

        self.retry.run(declare, errors=(OperationalError,))

"""The trainer's task channel: tasks sent to the farm within the run's share, their results taken in.

Results arrive on the run's Redis list; BLPOP wakes the trainer the moment one lands, without polling
each pending task. Every task sent stays pending (rlfarm.trainer.dispatch) until its first result is
accepted, and is listed in the run's `wanted` set, which workers check before they start: a copy
whose result already counted (the worker that pushed it took the key out of the set) or whose run
has ended is skipped unrun. Later copies of a task that already counted are dropped and counted as
duplicates. Tasks past the run's fair share of the farm are held here and sent, in order, as its
tasks finish. Whether pending tasks are alive, and what a copy that came back without a result
means, is the watchdog's (rlfarm.trainer.watchdog), which the channel asks once a second.

`FarmLink` is what the channel is made of; `FarmLink.open(owner)` wires the outbox, the watchdog and
the channel, all told of the one trainer that owns the run (rlfarm.trainer.factory gives the link).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Key, Outcome, Result, TaskSpec
from rlfarm.farm import keys
from rlfarm.farm.claim import Claim
from rlfarm.farm.policies.store import FROM_ENV
from rlfarm.farm.shares import FarmShare
from rlfarm.trainer.counters import DispatchStats
from rlfarm.trainer.dispatch import Outbox, RefusedKeys, RunOwner, Unowned
from rlfarm.trainer.ingest import PREFETCH, Ingest
from rlfarm.trainer.ledger import TaskLedger
from rlfarm.trainer.watchdog import Watchdog

if TYPE_CHECKING:
    import redis
    from celery import Celery

    from rlfarm.farm.outage import OutageRetry


@dataclass(frozen=True)
class ShareTerms:
    """The run's fair share of a farm others may train on too (rlfarm.farm.shares.FarmShare)."""

    url: str  # the farm's Redis, reached by a client of the share's own
    weight: float  # farm.share
    mode: str


class TaskChannel:
    """Submit tasks, admit them by the run's share, take the next result, gather a SYNC group."""

    def __init__(
        self, outbox: Outbox, watchdog: Watchdog, *, owner: RunOwner | None = None, share: ShareTerms | None = None
    ):
        """`share`: the run's fair share of the farm: tasks past its cap are held here and sent as the
        run's tasks finish (a SYNC group larger than the share goes in waves); without one every task
        is sent at once."""
        self.outbox = outbox
        self.watchdog = watchdog
        self.owner: RunOwner = owner if owner is not None else Unowned()
        self.client = outbox.client
        self.run_id = outbox.run_id
        self.results = keys.results(outbox.run_id)
        self.held: collections.deque[TaskSpec] = collections.deque()  # past the share's cap, in order
        self.ingest: Ingest | None = None  # results taken in by a thread (ingest_in_thread)
        self.busy_seconds = 0.0  # worker seconds of the run's accepted tasks (its used share)
        self.share: FarmShare | None = None
        if share is not None:
            self.share = FarmShare(
                share.url,
                self.run_id,
                share.weight,
                share.mode,
                demand=self.wants_slots,
                busy=lambda: self.busy_seconds,
            )

    @property
    def pending(self) -> TaskLedger:
        """The tasks sent and not yet answered (their one owner: rlfarm.trainer.ledger)."""
        return self.outbox.ledger

    @property
    def stats(self) -> DispatchStats:
        return self.outbox.stats

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def on_farm(self) -> int:
        """Tasks queued or running: pending ones, less those whose result waits in the run's results
        list (a learner behind holds finished tasks there, which take no slot)."""
        waiting = self.share.results_waiting if self.share is not None else 0
        return max(0, len(self.pending) - waiting)

    def wants_slots(self) -> int:
        """What the run asks of the farm's slots now: its tasks on the farm and those held back."""
        return self.on_farm() + len(self.held)

    def outstanding(self, kind: str | None = None) -> int:
        """Tasks sent and not yet answered, and those held back for the run's share."""
        if kind is None:
            return len(self.pending) + len(self.held)
        return self.pending.count(kind) + sum(1 for spec in self.held if spec.kind == kind)

    # ---- sending ---------------------------------------------------------------------------------
    def submit(self, spec: TaskSpec | dict[str, Any]) -> Key:
        """Send a task; a dict is read as TaskSpec fields, `run` being this channel's run."""
        return self.submit_many([spec])[0]

    def submit_many(self, specs: list[TaskSpec] | list[dict[str, Any]]) -> list[Key]:
        """Send tasks, all listed as wanted by one SADD before the first is sent (a worker skips a
        task not yet listed): a SYNC group of W tasks costs W + 1 round trips to Redis, not 2 W,
        and its last task starts sooner (benchmarks/scale.py)."""
        specs = [s if isinstance(s, TaskSpec) else TaskSpec.from_kwargs({"run": self.run_id, **s}) for s in specs]
        task_keys = [s.key for s in specs]
        seen: set[Key] = {spec.key for spec in self.held}
        for key in task_keys:
            if key in self.pending or key in seen:
                raise ValueError(f"task {key} is already in flight")
            seen.add(key)
        self.held.extend(specs)
        self.watchdog.after_outage(time.monotonic())  # a spec may name a version Redis lost meanwhile
        self.admit()
        self.stats.held += min(len(self.held), len(specs))
        return task_keys

    def admit(self) -> None:
        """Send held tasks, in order, while the run is under its share's cap."""
        if not self.held:
            return
        room = len(self.held)
        if self.share is not None:
            cap = self.share.cap(self.wants_slots())
            if cap is not None:
                room = min(room, cap - self.on_farm())
        if room <= 0:
            return
        specs = [self.held.popleft() for _ in range(room)]
        claim = self.outbox.claim
        if self.outbox.own_claim and not claim.held:
            claim.acquire()
        self.outbox.list_wanted([s.key for s in specs])
        for spec in specs:
            task_id = self.outbox.send(spec)
            self.pending.open(spec, task_id, time.monotonic())
            self.owner.on_event()

    def check(self, force: bool = False) -> None:
        """Once a second (any time with `force`): the watchdog's check, and held tasks admitted before
        it judges the pending ones (the share may have grown: another run ended or wants less)."""
        now = time.monotonic()
        if not self.watchdog.begin_check(now, force):
            return
        self.admit()
        self.watchdog.judge(now)

    def declare_queue(self) -> None:
        self.outbox.declare_queue()

    # ---- receiving -------------------------------------------------------------------------------
    def ingest_in_thread(self, prefetch: int = PREFETCH) -> None:
        """From now on a thread takes results out of Redis and decodes them (rlfarm.trainer.ingest);
        `receive` hands them over in the order they were pushed."""
        if self.ingest is None:
            self.ingest = Ingest(self.client, self.run_id, self.outbox.secret, prefetch)

    def close(self) -> None:
        """Stop the ingest thread, if there is one (the run is over, or failed)."""
        if self.ingest is not None:
            self.ingest.close()
            self.ingest = None

    def receive(self, timeout: float) -> Result | None:
        """One decoded result of any kind, or None when none arrived within `timeout` seconds
        (0: only one already there; a BLPOP's timeout is served at Redis's clock resolution, tens of
        milliseconds, too coarse for a learner that looks between its minibatches)."""
        if self.ingest is not None:
            return self._receive_taken(timeout)
        if timeout <= 0:
            raw = self.client.lpop(self.results)
            item = None if raw is None else (self.results, raw)
        else:
            item = self.client.blpop([self.results], timeout=max(timeout, 0.001))
        if item is None:
            return None
        t0 = time.process_time()
        try:
            message = codec.unpack(signing.open_result(self.run_id, item[1], self.outbox.secret))
        except signing.SignatureError as exc:  # not from a worker holding the farm's secret
            self.stats.forged += 1
            self.watchdog.unsigned(item[1], exc)
            return None
        self.stats.receive_seconds += time.process_time() - t0
        self.stats.received += 1
        return Result.from_message(message)

    def _receive_taken(self, timeout: float) -> Result | None:
        """`receive` from the ingest thread: decoded already, only counted here."""
        item = self.ingest.take(timeout)
        if item is None:
            return None
        what, payload, detail = item
        if what == "forged":
            self.stats.forged += 1
            self.watchdog.unsigned(payload, detail)
            return None
        self.stats.receive_seconds += detail
        self.stats.received += 1
        return payload

    def next_result(self, timeout: float) -> Result | None:
        """The next first-copy result of a pending task, or None (nothing came, a duplicate, a
        skipped copy, or a copy that came back without a result: the watchdog's). Waits at most
        `timeout` seconds and has pending tasks' liveness judged once a second."""
        # Judged before a message is taken, so that one in the results list is still counted there.
        self.check()
        if self.pending:
            timeout = min(timeout, max(self.watchdog.next_check - time.monotonic(), 0.01))
        message = self.receive(timeout)
        if message is None:
            return None
        key = message.key
        if message.incarnation is not None and message.incarnation != self.outbox.claim.incarnation:
            self.stats.duplicates += 1  # sent by an earlier trainer of this run id: not ours
            self.owner.late_copy(message)
            return None
        if message.policy_fetched:
            self.stats.policy_fetches += 1
        p = self.pending.get(key)
        match message.outcome:
            case Outcome.SKIPPED:  # a copy that found its task already counted: a free duplicate
                self.stats.skipped += 1
                self.stats.duplicates += 1
                return None
            case Outcome.UNVERIFIED:
                self.watchdog.unverified(key, p, message)
                return None
            case _ if p is None:
                self.stats.duplicates += 1  # a late copy of a task that already counted
                self.owner.late_copy(message)
                return None
            case Outcome.RESULT:
                if not self.watchdog.accepts(key, message):  # what it holds: the watchdog's to judge
                    return None
            case _:  # came back without a result (handed back, refused, failed): the watchdog's
                self.watchdog.failed(key, p, message)
                return None
        self.pending.settle(key, message.duration, time.monotonic())
        if message.duration is not None:
            self.busy_seconds += float(message.duration)
        self.admit()  # its slot is free: a held task of this run may take it
        self.stats.accepted += 1
        if message.kind != "eval":
            self.stats.accepted_task_ids.append(message.task_id)
        self.owner.accepted_snapshot(message)
        self.owner.on_event()
        return message

    def gather_group(self, specs: list[TaskSpec] | list[dict[str, Any]]) -> list[Result]:
        """SYNC: dispatch every spec, return their results ordered as `specs` (not by arrival).

        Results of other pending tasks (evaluations) that arrive meanwhile go to the owner's
        `handle_eval`.
        """
        task_keys = self.submit_many(specs)
        wanted = set(task_keys)
        results: dict[Key, Result] = {}
        while len(results) < len(task_keys):
            message = self.next_result(timeout=1.0)
            if message is None:
                continue
            key = message.key
            if key in wanted:
                results[key] = message
            else:
                self.owner.handle_eval(message)
        return [results[k] for k in task_keys]

    def unaccept(self, message: Result) -> None:
        """A result received but never used (its run ended first): no longer counted as accepted, so
        accepted results are exactly those learned from."""
        if message.task_id in self.stats.accepted_task_ids:
            self.stats.accepted_task_ids.remove(message.task_id)
            self.stats.accepted -= 1

    # ---- the run's start and end -------------------------------------------------------------------
    def start_share(self) -> None:
        """Register the run for its fair share (once the run is claimed)."""
        if self.share is not None:
            self.share.start()

    def stop_share(self) -> None:
        """Leave the farm's split: held tasks are dropped, the run's slots go to the others at once."""
        self.held.clear()
        if self.share is not None:
            self.share.stop()
            self.share = None

    def finish(self) -> None:
        """The run is over: workers skip whatever of it is still queued, its share goes to the others."""
        self.stop_share()
        self.close()
        self.client.delete(self.outbox.wanted, self.results, keys.taken(self.run_id))
        if self.outbox.own_claim:
            self.outbox.claim.release()


@dataclass(frozen=True)
class FarmLink:
    """What a trainer's channel to the farm is made of (rlfarm.trainer.factory gives it to the trainer;
    tests and benchmarks make one of their own). See Outbox and Watchdog for the fields."""

    app: Celery
    client: redis.Redis
    run_id: str
    task_timeout: float
    max_redispatch: int
    env: str | None = None  # the run's env id, shown in Flower's task labels
    lease_seconds: float = 10.0
    time_limit: float = 0.0
    retry: OutageRetry | None = None
    claim: Claim | None = None
    secret: Any = FROM_ENV
    share: ShareTerms | None = None
    refused: RefusedKeys | None = None  # told by those made before the trainer (rlfarm.farm.guard, ...)

    def open(self, owner: RunOwner | None = None) -> TaskChannel:
        """The channel, its watchdog and the outbox they share, wired to `owner` (the trainer that
        owns the run; none: nothing is said or written back)."""
        refused = self.refused if self.refused is not None else RefusedKeys(DispatchStats())
        outbox = Outbox(
            self.app,
            self.claim or Claim(self.client, self.run_id),
            own_claim=self.claim is None,
            env=self.env,
            time_limit=self.time_limit,
            retry=self.retry,
            secret=self.secret,
            stats=refused.stats,
        )
        watchdog = Watchdog(
            outbox,
            max_redispatch=self.max_redispatch,
            task_timeout=self.task_timeout,
            lease_seconds=self.lease_seconds,
            owner=owner,
            refused=refused,
        )
        return TaskChannel(outbox, watchdog, owner=owner, share=self.share)

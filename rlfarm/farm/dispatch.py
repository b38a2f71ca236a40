"""Sending task specs to the farm and taking in their results.

Results arrive on the run's Redis list; BLPOP wakes the trainer the moment one lands, without polling
each pending task. Every task sent stays pending under its key (kind, iteration, index) until its
first result is accepted, and is listed in the run's `wanted` set, which workers check before they
start: a copy whose result already counted (the worker that pushed it took the key out of the set) or
whose run has ended is skipped unrun.

Whether a pending task is still alive is judged once a second (`check`), never by how long it has
waited in the queue:
- running: its worker holds a lease (`rlfarm:<run>:lease:<task>`, a few seconds' expiry, renewed
  while it runs). A lease that expires means the worker died: the task is sent again at once.
- queued: its message is in the broker queue. One found neither queued nor leased for a lease period
  was lost (a worker killed between taking it and starting it, a Redis that lost data): sent again.
- straggling: running for more than `task_timeout` seconds: one backup copy is sent (tasks are
  deterministic, so any copy is as good as another); the first copy to finish counts.
- timed out: a worker reports that the task ran past its hard time limit (a hung env): sent again.
- refused: with RLFARM_SECRET, a worker reports that the task's spec, the run metadata or the policy
  did not verify (written by someone without the secret): counted (`security/refused_*`), the
  trainer puts back its own copy, and the task is sent again, not counted against `max_redispatch`.
A task re-sent more than `max_redispatch` times fails the run with the reason. Later copies of a
task that already counted are dropped and counted as duplicates. Why liveness works this way:
docs/architecture.md, decisions 2, 3 and 5.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import redis
from celery import Celery
from kombu.exceptions import OperationalError

from rlfarm.core import codec, signing
from rlfarm.farm.claim import Claim
from rlfarm.farm.outage import OutageRetry
from rlfarm.core.protocol import PROTOCOL, Key, Result, TaskSpec, legacy_refusal
from rlfarm.farm.store import FROM_ENV
from rlfarm.farm import keys


CHECK_SECONDS = 1.0  # how often pending tasks' leases and the run's state are looked at
IDLE_WARNING_SECONDS = 60.0  # pending tasks, none running: say so on the console this often
STALL_NOTICE_SECONDS = 60.0  # tasks running, none finished: say what runs where, and its time limit
AUTO_TIME_LIMIT_FIRST = 600.0  # hard time limit before any task of a kind has reported its duration
AUTO_TIME_LIMIT_MIN = 60.0
AUTO_TIME_LIMIT_FACTOR = 10.0  # times the longest duration seen so far
MAX_REFUSALS = 20  # copies of one task refused by workers before the run fails (a loop, not an attack)


class RolloutError(RuntimeError):
    """A task failed on its worker (bad env, missing policy version, ...): its message says why."""


class TaskLostError(RuntimeError):
    """A task was re-sent max_redispatch times and still produced no result."""


def describe_key(key: Key) -> str:
    return f"task {key[0]} (iteration {key[1]}, index {key[2]})"


@dataclass
class Pending:
    spec: TaskSpec
    task_id: str  # the newest copy's Celery task id
    last_seen: float  # when it was last known alive: sent, seen queued, or leased
    sent: float = 0.0  # when the newest copy was sent
    copies: int = 1
    started: float | None = None  # when a lease was first seen for it (None: not started yet)
    backups: int = 0  # straggler copies sent
    lease_gone: float | None = None  # when its lease was first seen gone while results waited
    reason: str = ""  # why it was last re-sent
    refused: float | None = None  # when a worker of another protocol refused it (re-sent at the next check)
    refusals: int = 0  # copies a worker refused (Result.unverified)
    unwanted_since: float | None = None  # when it was first seen out of `wanted` with no result waiting


@dataclass
class DispatchStats:
    dispatched: int = 0
    redispatched: int = 0
    duplicates: int = 0  # results dropped because their key had already counted
    skipped: int = 0  # of the duplicates, copies that workers skipped unrun
    received: int = 0
    accepted: int = 0
    leases_expired: int = 0  # re-sent because the worker running them was lost
    messages_lost: int = 0  # re-sent because their message was neither queued nor running
    time_limits: int = 0  # re-sent because they ran past their hard time limit
    stragglers: int = 0  # backup copies of tasks running longer than task_timeout
    held: int = 0  # tasks held back for a while because the run had its share of the farm's slots
    forged: int = 0  # results dropped because their signature did not verify (RLFARM_SECRET)
    forged_keys: int = 0  # keys of the run found as the trainer did not write them: refused, written back
    # Task inputs workers refused as not signed by the farm (Result.unverified), by kind; re-sent.
    unverified: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("policy", "meta", "spec"), 0))
    state_restored: int = 0  # times the run's state was found lost in Redis and written back
    refused: int = 0  # copies refused unrun by workers of another protocol version (re-sent)
    handed_back: int = 0  # copies handed back unfinished by workers shutting down (re-sent at once)
    receive_seconds: float = 0.0  # trainer CPU time spent decoding results
    policy_fetches: int = 0  # results whose worker fetched its policy version from Redis (not its cache)
    task_ids: dict[Key, list[str]] = field(default_factory=dict)
    # Of the rollouts only: every env step counted comes from exactly one of them (evaluations, which
    # every run has at its end, count in `accepted` but not here).
    accepted_task_ids: list[str] = field(default_factory=list)

    def security(self) -> dict[str, int]:
        """What was refused for want of a valid signature (RLFARM_SECRET), by what it was."""
        return {"security/refused_result": self.forged, "security/refused_key": self.forged_keys,
                **{f"security/refused_{kind}": n for kind, n in self.unverified.items()}}


class Dispatcher:
    def __init__(self, app: Celery, client: redis.Redis, run_id: str, task_timeout: float,
                 max_redispatch: int, on_event: Callable[[], None] | None = None, env: str | None = None,
                 lease_seconds: float = 10.0, time_limit: float = 0.0, retry: OutageRetry | None = None,
                 on_state_lost: Callable[[], None] | None = None, notify: Callable[[str], None] | None = None,
                 claim: Claim | None = None, secret: Any = FROM_ENV,
                 on_unverified: Callable[[str], str] | None = None, share: Any = None,
                 on_outage: Callable[[], None] | None = None):
        """`time_limit`: hard limit in seconds on a task's run time on its worker (0: derived from the
        durations seen). `retry`: the outage clock of `client`, also applied to sending tasks.
        `on_state_lost`: called when the run's metadata vanished from Redis (FLUSHALL, a Redis
        restarted without its data), after the dispatcher has written back its own state.
        `on_outage`: called once `client` is back after an outage, to put back what a failover to a
        replica may have lost of the newest writes (the trainer's newest policy version).
        `claim`: the trainer's claim of the run (rlfarm.farm.claim), whose incarnation every task carries;
        without one the dispatcher claims the run itself when it first sends a task.
        `on_unverified(kind)`: a worker refused the task's "policy", "meta" or "spec" as not signed by the
        farm; puts back what the trainer wrote and says what (the task is then sent again). Without
        it, a refusal fails the task as any other error does.
        `share`: the run's fair share of the farm (rlfarm.farm.shares.FarmShare): tasks past its cap
        are held here and sent as the run's tasks finish (a SYNC group larger than the share goes in
        waves); without one every task is sent at once."""
        self.app = app
        self.env = env  # the run's env id, sent as a label for Flower (workers take it from the run)
        self.client = client
        self.run_id = run_id
        self.key = keys.results(run_id)
        self.wanted = keys.wanted(run_id)
        self.task_timeout = task_timeout
        self.max_redispatch = max_redispatch
        self.lease_seconds = lease_seconds
        self.time_limit = time_limit
        self.retry = retry or OutageRetry()
        self.on_event = on_event or (lambda: None)
        self.on_state_lost = on_state_lost
        self.on_outage = on_outage
        self.on_unverified = on_unverified
        self.notify = notify or (lambda text: None)
        self.stats = DispatchStats()
        self.refusing: dict[str, Any] = {}  # workers of another protocol version -> theirs
        self.unsigned_workers: set[str] = set()  # workers named by results dropped as unsigned (warned once)
        self.pending: dict[Key, Pending] = {}
        self.share = share
        self.held: collections.deque[TaskSpec] = collections.deque()  # past the share's cap, in order
        self.busy_seconds = 0.0  # worker seconds of the run's accepted tasks (its used share)
        self.longest: dict[str, float] = {}  # longest task duration seen, per kind
        self._next_check = 0.0
        self._grace_until = 0.0
        self._restored_at = -1.0
        self._last_progress = time.monotonic()
        self._last_finish = time.monotonic()  # a task finished, or tasks were sent to an idle farm
        self._stall_noticed = 0.0
        self._outages_seen = self.retry.outages
        self._claim_renewed_at = self.retry.outages  # outages after which the claim was renewed
        self._queue = app.conf.task_default_queue
        self.secret = signing.secret_from_env() if secret is FROM_ENV else secret  # signs specs, checks results
        self._own_claim = claim is None
        self.claim = claim or Claim(client, run_id)
        self.on_rewrite: Callable[[], None] | None = None  # the trainer writes back what it owns
        self._rewrite_due = False

    def refused_key(self, text: str) -> None:
        """A key of the run was not as the trainer (or its workers) wrote it: counted, said, and what the
        trainer owns is written back at the next check (rlfarm.farm.guard, PolicyStore, Claim)."""
        self.stats.forged_keys += 1
        self.notify(text)
        self._rewrite_due = True

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
        return (sum(1 for key in self.pending if key[0] == kind)
                + sum(1 for spec in self.held if spec.kind == kind))

    # ---- sending ---------------------------------------------------------------------------------
    def time_limit_for(self, kind: str) -> float:
        if self.time_limit > 0:
            return self.time_limit
        if kind not in self.longest:
            return AUTO_TIME_LIMIT_FIRST
        return max(AUTO_TIME_LIMIT_MIN, AUTO_TIME_LIMIT_FACTOR * self.longest[kind])

    def _send(self, spec: TaskSpec) -> str:
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

    def submit(self, spec: TaskSpec | dict[str, Any]) -> Key:
        """Send a task; a dict is read as TaskSpec fields, `run` being this dispatcher's run."""
        return self.submit_many([spec])[0]

    def submit_many(self, specs: list[TaskSpec] | list[dict[str, Any]]) -> list[Key]:
        """Send tasks, all listed as wanted by one SADD before the first is sent (a worker skips a
        task not yet listed): a SYNC group of W tasks costs W + 1 round trips to Redis, not 2 W,
        and its last task starts sooner (benchmarks/scale.py)."""
        specs = [s if isinstance(s, TaskSpec) else TaskSpec.from_kwargs({"run": self.run_id, **s})
                 for s in specs]
        task_keys = [s.key for s in specs]
        seen: set[Key] = {spec.key for spec in self.held}
        for key in task_keys:
            if key in self.pending or key in seen:
                raise ValueError(f"task {key} is already in flight")
            seen.add(key)
        self.held.extend(specs)
        self.after_outage(time.monotonic())  # a spec may name a version Redis lost meanwhile
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
        if not self.pending:  # nothing was running: the wait for a finished task starts now
            self._last_finish = time.monotonic()
        if self._own_claim and not self.claim.held:
            self.claim.acquire()
        self.client.sadd(self.wanted, keys.LIVE, *[keys.task(*s.key) for s in specs])
        for spec in specs:
            task_id = self._send(spec)
            now = time.monotonic()
            self.pending[spec.key] = Pending(spec, task_id, now, sent=now)
            self.on_event()

    def _resend(self, key: Key, p: Pending, reason: str, backup: bool = False, counted: bool = True) -> None:
        """`counted`: the copy counts towards max_redispatch. Copies that say nothing about the task do
        not: a worker refused an attacker's write (a few writes must not end the run), a worker of
        another protocol version refused it unrun, or a worker shutting down handed it back."""
        if counted and not backup and p.copies > self.max_redispatch:
            raise TaskLostError(f"{describe_key(key)} was sent {p.copies} times without a result; "
                                f"last: {reason}")
        self.client.sadd(self.wanted, keys.LIVE, keys.task(*key))  # a timed-out copy may have left it
        p.task_id = self._send(p.spec)
        p.copies += counted
        p.reason = reason
        p.refused = None
        p.last_seen = p.sent = time.monotonic()
        p.lease_gone = None
        if backup:
            p.backups += 1
            p.started = time.monotonic()  # the next backup, if any, only another task_timeout later
        else:
            p.started = None
        self.stats.redispatched += 1

    # ---- receiving -------------------------------------------------------------------------------
    def receive(self, timeout: float) -> Result | None:
        """One decoded result of any kind, or None when none arrived within `timeout` seconds
        (0: only one already there; a BLPOP's timeout is served at Redis's clock resolution, tens of
        milliseconds, too coarse for a learner that looks between its minibatches)."""
        if timeout <= 0:
            raw = self.client.lpop(self.key)
            item = None if raw is None else (self.key, raw)
        else:
            item = self.client.blpop([self.key], timeout=max(timeout, 0.001))
        if item is None:
            return None
        t0 = time.process_time()
        try:
            message = codec.unpack(signing.open_result(self.run_id, item[1], self.secret))
        except signing.SignatureError as exc:  # not from a worker holding the farm's secret
            self.stats.forged += 1
            self._unsigned(item[1], exc)
            return None
        self.stats.receive_seconds += time.process_time() - t0
        self.stats.received += 1
        return Result.from_message(message)

    def _unsigned(self, data: bytes, exc: signing.SignatureError) -> None:
        """A result dropped for its signature: forged, or pushed by a worker without the farm's secret
        (or with another one). Nothing in it counts, but the task it names, if pending as that very
        copy, is sent again for the other workers (at most MAX_REFUSALS times), so such a worker
        cannot stall the run; said once per worker it names."""
        try:
            claimed = Result.from_message(codec.unpack(signing.open_result(self.run_id, data, None)))
        except Exception:  # noqa: BLE001 - not even a result: nothing to re-send
            self.notify(f"dropped {exc}")
            return
        worker = str(claimed.worker)[:80]
        p = self.pending.get(claimed.key)
        resend = p is not None and claimed.task_id == p.task_id
        if worker not in self.unsigned_workers:
            self.unsigned_workers.add(worker)
            why = ("it has no RLFARM_SECRET" if str(claimed.error or "").startswith("NoSecret:") else
                   "one without this farm's RLFARM_SECRET, or with another one, or a forgery")
            self.notify(f"dropped {exc}; it names worker {worker} ({why}): give every worker the farm's "
                        f"secret" + ("; sending its task again to the others" if resend else ""))
        if resend:
            p.refusals += 1
            if p.refusals > MAX_REFUSALS:
                raise TaskLostError(f"{describe_key(claimed.key)} came back unsigned {p.refusals} times; "
                                    f"last: {exc}")
            self._resend(claimed.key, p, f"its result was dropped: {exc}", counted=False)

    def next_result(self, timeout: float) -> Result | None:
        """The next first-copy result of a pending task, or None (nothing came, a duplicate, a
        skipped copy, or a copy re-sent after a time limit). Waits at most `timeout` seconds and
        judges pending tasks' liveness once a second."""
        # Judged before a message is taken, so that one in the results list is still counted there.
        self.check()
        if self.pending:
            timeout = min(timeout, max(self._next_check - time.monotonic(), 0.01))
        message = self.receive(timeout)
        if message is None:
            return None
        key = message.key
        if message.incarnation is not None and message.incarnation != self.claim.incarnation:
            self.stats.duplicates += 1  # sent by an earlier trainer of this run id: not ours
            return None
        if message.policy_fetched:
            self.stats.policy_fetches += 1
        if message.skipped:  # a copy that found its task already counted: a free duplicate
            self.stats.skipped += 1
            self.stats.duplicates += 1
            return None
        p = self.pending.get(key)
        if message.error is not None and message.unverified in self.stats.unverified:
            self._unverified(key, p, message)
            return None
        if p is None:
            self.stats.duplicates += 1  # a late copy of a task that already counted
            return None
        if message.handed_back:  # its worker is shutting down (SIGTERM): not the task's fault
            if message.task_id == p.task_id:
                self.stats.handed_back += 1
                reason = (f"{describe_key(key)} was handed back by {message.worker}: "
                          f"{(message.error or '').removeprefix('HandedBack: ')}")
                self.notify(f"{reason}; sending it again")
                self._resend(key, p, reason, counted=False)
            return None
        if message.refused or legacy_refusal(message.error):
            self._refused(p, message)
            return None
        if message.error is not None:
            where = f"{describe_key(key)} failed on {message.worker}: {message.error}"
            self.check_state()  # a task that found no policy or metadata: was the run's state lost?
            if not message.retryable and self._restored_at < p.sent:
                raise RolloutError(where)
            if message.task_id == p.task_id:  # else a newer copy is already on its way
                if message.retryable:
                    self.stats.time_limits += 1
                self.notify(f"{where}; sending it again")
                self._resend(key, p, where)
            return None
        del self.pending[key]
        self._last_finish = time.monotonic()
        if message.duration is not None:
            self.longest[message.kind] = max(self.longest.get(message.kind, 0.0), float(message.duration))
            self.busy_seconds += float(message.duration)
        self.admit()  # its slot is free: a held task of this run may take it
        self.stats.accepted += 1
        if message.kind != "eval":
            self.stats.accepted_task_ids.append(message.task_id)
        self.on_event()
        return message

    def _refused(self, p: Pending, message: Result) -> None:
        """A worker of another protocol version refused the task unrun: warn once per worker, and send
        the task again at the next check (a second later), for the other workers to take."""
        if message.task_id != p.task_id:  # a newer copy is already on its way
            return
        self.stats.refused += 1
        p.refused = time.monotonic()
        theirs = message.protocol if message.refused else 0  # 0: a worker from before versions
        if message.worker not in self.refusing:
            self.refusing[message.worker] = theirs
            self.notify(f"worker {message.worker} speaks rlfarm protocol {theirs}, this trainer "
                        f"{PROTOCOL}: it refuses this run's tasks, which go to the other workers; "
                        f"upgrade it to this trainer's rlfarm")

    def _unverified(self, key: Key, p: Pending | None, message: Result) -> None:
        """A worker refused the task's policy, run metadata or spec: written by someone without the
        farm's secret (the worker's own report is signed). Counted and warned about; the trainer puts
        back its own copy, and the task is sent again, so one forged write does not end the run."""
        self.stats.unverified[message.unverified] += 1
        where = f"{describe_key(key)} was refused on {message.worker}: {message.error}"
        if self.on_unverified is None:  # nobody holds a genuine copy to put back
            raise RolloutError(where.replace(" was refused on ", " failed on ", 1))
        repaired = self.on_unverified(message.unverified)
        if p is not None and message.task_id == p.task_id:  # else a newer copy is already on its way
            p.refusals += 1
            if p.refusals > MAX_REFUSALS:
                raise TaskLostError(f"{describe_key(key)} was refused {p.refusals} times; last: {where}")
            self.notify(f"{where}; {repaired}sending it again")
            # Not counted: the report is signed, so it comes from a worker holding the farm's secret,
            # and what it refused was written by someone who does not.
            self._resend(key, p, where, counted=False)
        else:
            self.notify(f"{where}; {repaired}".rstrip("; "))

    def unaccept(self, message: Result) -> None:
        """A result received but never used (its run ended first): no longer counted as accepted, so
        accepted results are exactly those learned from."""
        if message.task_id in self.stats.accepted_task_ids:
            self.stats.accepted_task_ids.remove(message.task_id)
            self.stats.accepted -= 1

    # ---- liveness --------------------------------------------------------------------------------
    def check(self, force: bool = False) -> None:
        """Once a second: is the run's state still in Redis, and is every pending task queued,
        running or finished? Lost ones are sent again (see the module docstring)."""
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self.claim.check()  # another trainer took the run over: stop before touching it
        self._next_check = now + min(CHECK_SECONDS, self.task_timeout / 4, self.lease_seconds / 4)
        self.after_outage(now)
        if self._rewrite_due:
            self._rewrite(now)
        self.admit()  # the share may have grown (another run ended or wants less)
        if not self.pending:
            return
        pending = list(self.pending)
        texts = [keys.task(*k) for k in pending]
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(keys.meta(self.run_id))
        pipe.llen(self.key)
        pipe.smismember(self.wanted, texts)
        for text in texts:
            pipe.get(keys.lease(self.run_id, text))  # its holder: the worker process running it
        meta_exists, backlog, wanted, *leases = pipe.execute()
        if self.retry.outages != self._outages_seen:  # Redis was away during this very look
            self.after_outage(time.monotonic())
            return
        if not meta_exists:
            self._state_lost(now)
            return
        if now < self._grace_until:
            return
        unseen: list[Key] = []
        for key, is_wanted, leased in zip(pending, wanted, leases):
            p = self.pending[key]
            if p.refused is not None:
                self._resend(key, p, "refused by a worker of another protocol version", counted=False)
                continue
            if not is_wanted:
                # Its result has been pushed and waits in the results list; or, with the list empty and
                # no worker running it, someone took it out of `wanted` (one SREM must not stall the run).
                if backlog or leased:
                    p.unwanted_since = None
                elif p.unwanted_since is None:
                    p.unwanted_since = now
                elif now - p.unwanted_since > self.lease_seconds:
                    p.unwanted_since = None
                    self.refused_key(f"refused {self.wanted}: {describe_key(key)} was taken out of it, but no "
                                     f"result of it came (written by someone else); sending it again")
                    self._resend(key, p, "its entry in the run's wanted set was removed", counted=False)
                continue
            if leased:
                p.last_seen, p.lease_gone = now, None
                if p.started is None:
                    p.started = now
                elif (now - p.started > self.task_timeout and p.backups < self.max_redispatch):
                    self.stats.stragglers += 1
                    self._resend(key, p, f"still running {now - p.started:.0f} s after it started "
                                         f"(farm.task_timeout {self.task_timeout:g} s)", backup=True)
            elif p.started is not None:
                # A worker's last word (a time-limit report, an error) deletes the lease as it lands in
                # the results list: while results wait to be read, give the lease one more look.
                if backlog and (p.lease_gone is None or now - p.lease_gone < self.lease_seconds):
                    p.lease_gone = p.lease_gone or now
                    continue
                self.stats.leases_expired += 1
                reason = (f"the worker running {describe_key(key)} was lost (its lease expired "
                          f"{self.lease_seconds:g} s after its last renewal)")
                self.notify(f"{reason}; sending it again")
                self._resend(key, p, reason)
            elif now - p.last_seen > self.lease_seconds:
                unseen.append(key)
        self._notice_stall(now, pending, leases)
        # Progress: a task running, a result waiting to be read, or one accepted (`_last_finish`);
        # whatever else keeps the run from moving (no workers, only refusing or unsigned ones), say so.
        if any(leases) or backlog:
            self._last_progress = now
        elif now - max(self._last_progress, self._last_finish) > IDLE_WARNING_SECONDS:
            self._last_progress = now  # again in another IDLE_WARNING_SECONDS if nothing changes
            if self.unsigned_workers:
                self.notify(f"{len(self.pending)} tasks waiting and no result accepted for "
                            f"{IDLE_WARNING_SECONDS:.0f} s: {self.stats.forged} results were dropped as not "
                            f"signed by this farm (workers {', '.join(sorted(self.unsigned_workers)[:4])}): "
                            f"start workers with the farm's RLFARM_SECRET")
            elif self.refusing:
                self.notify(f"{len(self.pending)} tasks waiting and none started for "
                            f"{IDLE_WARNING_SECONDS:.0f} s: only workers of another protocol version took "
                            f"them ({', '.join(f'{w}: protocol {v}' for w, v in self.refusing.items())}; "
                            f"this trainer's is {PROTOCOL}): start workers of this trainer's rlfarm")
            else:
                self.notify(f"{len(self.pending)} tasks waiting and none started for "
                            f"{IDLE_WARNING_SECONDS:.0f} s: are workers of this rlfarm (protocol {PROTOCOL}, "
                            f"queue {self._queue}) running, connected to the same Redis (`rlfarm worker "
                            f"--redis URL`)? Workers of another rlfarm version consume another queue")
        if unseen:
            queued = self.queued_task_ids()
            for key in unseen:
                p = self.pending[key]
                if p.task_id in queued:
                    p.last_seen = now
                else:
                    self.stats.messages_lost += 1
                    reason = f"the message of {describe_key(key)} was lost (neither queued nor running)"
                    self.notify(f"{reason}; sending it again")
                    self._resend(key, p, reason)

    def _notice_stall(self, now: float, task_keys: list[Key], leases: list[Any]) -> None:
        """Tasks run but none has finished for a minute: say what runs, where, for how long and what
        limit applies, every minute. A hung env looks like this until its time limit speaks (600 s
        for a run's first tasks, by default)."""
        if now - self._last_finish < STALL_NOTICE_SECONDS or now - self._stall_noticed < STALL_NOTICE_SECONDS:
            return
        running = [(key, self.pending[key], holder) for key, holder in zip(task_keys, leases)
                   if holder and self.pending[key].started is not None]
        if not running:
            return
        self._stall_noticed = now
        shown = ", ".join(f"{describe_key(key)} for {now - p.started:.0f} s on "
                          f"{holder.decode(errors='replace') if isinstance(holder, bytes) else holder}"
                          for key, p, holder in running[:4])
        more = f" and {len(running) - 4} more" if len(running) > 4 else ""
        kinds = sorted({key[0] for key, _, _ in running})
        self.notify(f"no task has finished for {now - self._last_finish:.0f} s; running: {shown}{more}; "
                    + "; ".join(self.describe_time_limit(kind) for kind in kinds)
                    + ": an env that hangs looks like this")

    def describe_time_limit(self, kind: str) -> str:
        """The hard time limit a task of `kind` is sent with, and where it comes from."""
        limit = self.time_limit_for(kind)
        if self.time_limit > 0:
            source = "farm.task_time_limit"
        elif kind not in self.longest:
            source = f"farm.task_time_limit 0: {AUTO_TIME_LIMIT_FIRST:g} s until a {kind} task has finished"
        else:
            source = (f"farm.task_time_limit 0: {AUTO_TIME_LIMIT_FACTOR:g}x the longest {kind} task, "
                      f"at least {AUTO_TIME_LIMIT_MIN:g} s")
        return (f"a {kind} task is killed at its time limit of {limit:g} s ({source}; a worker's "
                f"--time-limit may lower it)")

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

    def after_outage(self, now: float) -> None:
        """Once after each Redis outage: put back what it may have lost, then let workers renew their
        leases before any task is judged.

        A restart from an append-only file loses nothing, but a Sentinel failover promotes a replica
        that copied the master's writes asynchronously: it lacks the newest ones, in order. What that
        can lose and how it comes back: the `wanted` entries and messages of tasks sent last (re-listed
        here; a message neither queued nor running is re-sent a lease period later), a worker's
        result with its lease's deletion (the lease expires: re-sent), the trainer's newest policy
        version (`on_outage` writes it back), a result already read (read again: a duplicate).
        Errors of copies sent before now (a policy version missing meanwhile) are retried."""
        if self.retry.outages == self._outages_seen:
            return
        self.renew_claim_after_outage()  # first: workers drop every task of a run without a live claim
        self._outages_seen = self.retry.outages
        self._restored_at = now
        if self.pending:
            self.client.sadd(self.wanted, keys.LIVE, *[keys.task(*k) for k in self.pending])
        if self.on_outage is not None:
            self.on_outage()
        self._grace(now)

    def _rewrite(self, now: float) -> None:
        """After a forged key: the run's wanted entries, its claim and what the trainer owns (metadata,
        newest and pinned versions) written back; workers get a lease period before tasks are judged."""
        self._rewrite_due = False
        self.client.sadd(self.wanted, keys.LIVE, *[keys.task(*k) for k in self.pending])
        if self.claim.held:
            self.claim.renew()
        if self.on_rewrite is not None:
            self.on_rewrite()
        self._grace(now)

    def check_state(self) -> None:
        """Only the first part of `check`: was Redis away, is the run's metadata still in Redis?"""
        self.after_outage(time.monotonic())
        if not self.client.exists(keys.meta(self.run_id)):
            self._state_lost(time.monotonic())

    def queued_task_ids(self) -> set[str]:
        """Ids of the task messages waiting in the broker queue (kombu keeps them as JSON in a list)."""
        ids = set()
        for raw in self.client.lrange(self._queue, 0, -1):
            try:
                ids.add(json.loads(raw)["headers"]["id"])
            except (ValueError, KeyError, TypeError):
                continue  # not a Celery message: not ours to judge
        return ids

    def _grace(self, now: float) -> None:
        self._grace_until = now + self.lease_seconds
        for p in self.pending.values():
            p.last_seen = now

    def _state_lost(self, now: float) -> None:
        """The run's keys are gone (FLUSHALL, or a Redis restarted without its data): write back what
        this side owns, then let workers renew their leases before judging any task."""
        self.stats.state_restored += 1
        self._restored_at = now  # errors of copies sent before now (no policy, no meta) are retried
        self.declare_queue()
        self.client.sadd(self.wanted, keys.LIVE, *[keys.task(*k) for k in self.pending])
        if self.claim.held:
            self.claim.renew()  # the claim went with the rest: until it is back workers drop our tasks
        if self.on_state_lost is not None:
            self.on_state_lost()
        self._grace(now)

    def declare_queue(self) -> None:
        """(Re)create the broker's routing of task messages to the task queue. kombu keeps that
        binding in Redis and declares it once per connection: after a FLUSHALL every task sent would
        otherwise be routed nowhere, silently."""
        def declare() -> None:
            with self.app.connection_for_write() as conn:
                self.app.amqp.queues[self._queue](conn.default_channel).declare()
        self.retry.run(declare, errors=(OperationalError,))

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
        self.client.delete(self.wanted, self.key)
        if self._own_claim:
            self.claim.release()

    def gather_group(self, specs: list[TaskSpec] | list[dict[str, Any]],
                     on_other: Callable[[Result], None] | None = None) -> list[Result]:
        """SYNC: dispatch every spec, return their results ordered as `specs` (not by arrival).

        Results of other pending tasks (evaluations) that arrive meanwhile go to `on_other`.
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
            elif on_other is not None:
                on_other(message)
        return [results[k] for k in task_keys]

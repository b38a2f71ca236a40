"""Whether the run's pending tasks are alive, what to re-send and when to give up, and what the run
does about refusals and outages. The tasks themselves are the ledger's (rlfarm.trainer.ledger): the
watchdog tells it what it saw, and never changes a task itself.

Whether a pending task is still alive is judged once a second (the channel's `check`), never by how
long it has waited in the queue:
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
A task re-sent more than `max_redispatch` times fails the run with the reason. The run's state lost
in Redis (FLUSHALL, a restart without its data) and a key of it found forged take one path: the
wanted entries and the claim are put back, the trainer writes back what it owns, and workers get a
lease period to renew their leases before any task is judged. Why liveness works this way:
docs/architecture.md, decisions 2, 3 and 5.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from rlfarm.core import codec, signing
from rlfarm.core.protocol import PROTOCOL, Key, Result
from rlfarm.errors import EnvFault, RolloutError, TaskLostError
from rlfarm.farm import keys
from rlfarm.trainer.counters import DispatchStats
from rlfarm.trainer.dispatch import Outbox, RefusedKeys, RunOwner, Unowned
from rlfarm.trainer.ledger import Pending, TaskLedger, describe_key

CHECK_SECONDS = 1.0  # how often pending tasks' leases and the run's state are looked at
IDLE_WARNING_SECONDS = 60.0  # pending tasks, none running: say so on the console this often
STALL_NOTICE_SECONDS = 60.0  # tasks running, none finished: say what runs where, and its time limit
MAX_REFUSALS = 20  # copies of one task refused by workers before the run fails (a loop, not an attack)


class Watchdog:
    """Leases, lost messages, stragglers, refusals and outages of one run's pending tasks."""

    def __init__(
        self,
        outbox: Outbox,
        *,
        max_redispatch: int,
        task_timeout: float,
        lease_seconds: float = 10.0,
        owner: RunOwner | None = None,
        refused: RefusedKeys | None = None,
    ):
        """`owner`: the trainer, told when the run's state is to be written back (after an outage, a
        FLUSHALL, a forged key, a worker's refusal) and given what to say. `refused`: where keys found
        forged are told, by the watchdog and by those made before it."""
        self.outbox = outbox
        self.client = outbox.client
        self.run_id = outbox.run_id
        self.results = keys.results(outbox.run_id)
        self.max_redispatch = max_redispatch  # copies of a task sent before the run gives up on it
        self.task_timeout = task_timeout
        self.lease_seconds = lease_seconds
        self.owner: RunOwner = owner if owner is not None else Unowned()
        self.refused = refused if refused is not None else RefusedKeys(outbox.stats)
        self.refusing: dict[str, Any] = {}  # workers of another protocol version -> theirs
        self.unsigned_workers: set[str] = set()  # workers named by results dropped as unsigned (warned once)
        self.next_check = 0.0
        self._grace_until = 0.0
        self._restored_at = -1.0
        self._last_progress = time.monotonic()
        self._stall_noticed = 0.0
        self._outages_seen = outbox.retry.outages

    @property
    def pending(self) -> TaskLedger:
        return self.outbox.ledger

    @property
    def stats(self) -> DispatchStats:
        return self.outbox.stats

    def refused_key(self, text: str) -> None:
        """A key of the run was not as the trainer (or its workers) wrote it: counted, said, and what the
        trainer owns is written back at the next check."""
        self.refused.mark()
        self.owner.warn(text)

    # ---- the check: before the channel admits held tasks, then the pending tasks judged ------------
    def begin_check(self, now: float, force: bool = False) -> bool:
        """Once a second: the claim still ours, what an outage or a forged key may have lost put back.
        False when it is not time yet (the pending tasks are judged only after a True)."""
        if not force and now < self.next_check:
            return False
        self.outbox.claim.check()  # another trainer took the run over: stop before touching it
        self.next_check = now + min(CHECK_SECONDS, self.task_timeout / 4, self.lease_seconds / 4)
        self.after_outage(now)
        if self.refused.due:
            self._put_back(now, lost=False)
        return True

    def judge(self, now: float) -> None:
        """Is the run's state still in Redis, and is every pending task queued, running or finished?
        Lost ones are sent again (see the module docstring)."""
        if not self.pending:
            return
        pending = list(self.pending)
        texts = [keys.task(*k) for k in pending]
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(keys.meta(self.run_id))
        pipe.llen(self.results)
        # Results the ingest thread took and is decoding: not lost. Read after `results`, so one it
        # moves between the two reads is counted twice, never missed.
        pipe.llen(keys.taken(self.run_id))
        pipe.smismember(self.outbox.wanted, texts)
        for text in texts:
            pipe.get(keys.lease(self.run_id, text))  # its holder: the worker process running it
        meta_exists, backlog, taken, wanted, *leases = pipe.execute()
        backlog += taken
        if self.outbox.retry.outages != self._outages_seen:  # Redis was away during this very look
            self.after_outage(time.monotonic())
            return
        if not meta_exists:
            self._put_back(now, lost=True)
            return
        if now < self._grace_until:
            return
        unseen: list[Key] = []
        for key, is_wanted, leased in zip(pending, wanted, leases):
            p = self.pending[key]
            if p.refused is not None:
                self.resend(key, "refused by a worker of another protocol version", counted=False)
                continue
            if not is_wanted:
                # Its result has been pushed and waits in the results list; or, with the list empty and
                # no worker running it, someone took it out of `wanted` (one SREM must not stall the run).
                p = self.pending.unwanted(key, None if backlog or leased else now)
                if p.unwanted_since is not None and now - p.unwanted_since > self.lease_seconds:
                    self.pending.unwanted(key, None)
                    self.refused_key(
                        f"refused {self.outbox.wanted}: {describe_key(key)} was taken out of it, "
                        f"but no result of it came (written by someone else); sending it again"
                    )
                    self.resend(key, "its entry in the run's wanted set was removed", counted=False)
                continue
            if leased:
                first = p.started is None
                p = self.pending.leased(key, now)
                if not first and now - p.started > self.task_timeout and p.backups < self.max_redispatch:
                    self.stats.stragglers += 1
                    self.resend(
                        key,
                        f"still running {now - p.started:.0f} s after it started "
                        f"(farm.task_timeout {self.task_timeout:g} s)",
                        backup=True,
                    )
            elif p.started is not None:
                # A worker's last word (a time-limit report, an error) deletes the lease as it lands in
                # the results list: while results wait to be read, give the lease one more look.
                if backlog and (p.lease_gone is None or now - p.lease_gone < self.lease_seconds):
                    self.pending.lease_missing(key, now)
                    continue
                self.stats.leases_expired += 1
                reason = (
                    f"the worker running {describe_key(key)} was lost (its lease expired "
                    f"{self.lease_seconds:g} s after its last renewal)"
                )
                self.owner.warn(f"{reason}; sending it again")
                self.resend(key, reason)
            elif now - p.last_seen > self.lease_seconds:
                unseen.append(key)
        self._notice_stall(now, pending, leases)
        self._notice_idle(now, leases, backlog)
        if unseen:
            queued = self.queued_task_ids()
            for key in unseen:
                if self.pending[key].task_id in queued:
                    self.pending.seen(key, now)
                else:
                    self.stats.messages_lost += 1
                    reason = f"the message of {describe_key(key)} was lost (neither queued nor running)"
                    self.owner.warn(f"{reason}; sending it again")
                    self.resend(key, reason)

    def _notice_idle(self, now: float, leases: list[Any], backlog: int) -> None:
        """Progress: a task running, a result waiting to be read, or one accepted (`last_finish`);
        whatever else keeps the run from moving (no workers, only refusing or unsigned ones), say so."""
        if any(leases) or backlog:
            self._last_progress = now
            return
        if now - max(self._last_progress, self.pending.last_finish) <= IDLE_WARNING_SECONDS:
            return
        self._last_progress = now  # again in another IDLE_WARNING_SECONDS if nothing changes
        if self.unsigned_workers:
            self.owner.warn(
                f"{len(self.pending)} tasks waiting and no result accepted for "
                f"{IDLE_WARNING_SECONDS:.0f} s: {self.stats.forged} results were dropped as not "
                f"signed by this farm (workers {', '.join(sorted(self.unsigned_workers)[:4])}): "
                f"start workers with the farm's RLFARM_SECRET"
            )
        elif self.refusing:
            self.owner.warn(
                f"{len(self.pending)} tasks waiting and none started for "
                f"{IDLE_WARNING_SECONDS:.0f} s: only workers of another protocol version took "
                f"them ({', '.join(f'{w}: protocol {v}' for w, v in self.refusing.items())}; "
                f"this trainer's is {PROTOCOL}): start workers of this trainer's rlfarm"
            )
        else:
            self.owner.warn(
                f"{len(self.pending)} tasks waiting and none started for "
                f"{IDLE_WARNING_SECONDS:.0f} s: are workers of this rlfarm (protocol {PROTOCOL}, "
                f"queue {self.outbox.queue}) running, connected to the same Redis (`rlfarm worker "
                f"--redis URL`)? Workers of another rlfarm version consume another queue"
            )

    def _notice_stall(self, now: float, task_keys: list[Key], leases: list[Any]) -> None:
        """Tasks run but none has finished for a minute: say what runs, where, for how long and what
        limit applies, every minute. A hung env looks like this until its time limit speaks (600 s
        for a run's first tasks, by default)."""
        last_finish = self.pending.last_finish
        if now - last_finish < STALL_NOTICE_SECONDS or now - self._stall_noticed < STALL_NOTICE_SECONDS:
            return
        running = [
            (key, self.pending[key], holder)
            for key, holder in zip(task_keys, leases)
            if holder and self.pending[key].started is not None
        ]
        if not running:
            return
        self._stall_noticed = now
        shown = ", ".join(
            f"{describe_key(key)} for {now - p.started:.0f} s on "
            f"{holder.decode(errors='replace') if isinstance(holder, bytes) else holder}"
            for key, p, holder in running[:4]
        )
        more = f" and {len(running) - 4} more" if len(running) > 4 else ""
        kinds = sorted({key[0] for key, _, _ in running})
        self.owner.warn(
            f"no task has finished for {now - last_finish:.0f} s; running: {shown}{more}; "
            + "; ".join(self.outbox.describe_time_limit(kind) for kind in kinds)
            + ": an env that hangs looks like this"
        )

    def queued_task_ids(self) -> set[str]:
        """Ids of the task messages waiting in the broker queue (kombu keeps them as JSON in a list)."""
        ids = set()
        for raw in self.client.lrange(self.outbox.queue, 0, -1):
            try:
                ids.add(json.loads(raw)["headers"]["id"])
            except (ValueError, KeyError, TypeError):
                continue  # not a Celery message: not ours to judge
        return ids

    # ---- what a result holds ------------------------------------------------------------------------
    def accepts(self, key: Key, message: Result) -> bool:
        """A first-copy result checked before it counts: rewards that are NaN or infinite (a broken env,
        a flaky simulator) are never learned from. The task is sent again, counted towards
        max_redispatch, so an env that always returns them fails the run in one line naming them."""
        rewards = (message.rollout or {}).get("rewards")
        if rewards is None or np.isfinite(rewards).all():
            return True
        self.stats.nonfinite += 1
        reason = f"{describe_key(key)} came back from {message.worker} with NaN or infinite rewards"
        if message.task_id == self.pending[key].task_id:  # else a newer copy is already on its way
            self.owner.warn(f"{reason}; sending it again")
            self.resend(key, reason)
        return False

    # ---- re-sending ---------------------------------------------------------------------------------
    def resend(self, key: Key, reason: str, backup: bool = False, counted: bool = True) -> None:
        """Send a pending task again, or give up on it: a copy `counted` towards max_redispatch past
        that many fails the run. Copies that say nothing about the task are not counted: a worker
        refused an attacker's write (a few writes must not end the run), a worker of another protocol
        version refused it unrun, or a worker shutting down handed it back."""
        p = self.pending[key]
        if counted and not backup and p.copies > self.max_redispatch:
            raise TaskLostError(f"{describe_key(key)} was sent {p.copies} times without a result; last: {reason}")
        self.outbox.list_wanted([key])  # a timed-out copy may have left it
        task_id = self.outbox.send(p.spec)
        self.pending.copied(key, task_id, reason, backup=backup, counted=counted, now=time.monotonic())
        self.stats.redispatched += 1

    # ---- outages and lost state -------------------------------------------------------------------
    def after_outage(self, now: float) -> None:
        """Once after each Redis outage: put back what it may have lost, then let workers renew their
        leases before any task is judged.

        A restart from an append-only file loses nothing, but a Sentinel failover promotes a replica
        that copied the master's writes asynchronously: it lacks the newest ones, in order. What that
        can lose and how it comes back: the `wanted` entries and messages of tasks sent last (re-listed
        here; a message neither queued nor running is re-sent a lease period later), a worker's
        result with its lease's deletion (the lease expires: re-sent), the trainer's newest policy
        version (its `after_outage` writes it back), a result already read (read again: a duplicate).
        Errors of copies sent before now (a policy version missing meanwhile) are retried."""
        if self.outbox.retry.outages == self._outages_seen:
            return
        self.outbox.renew_claim_after_outage()  # first: workers drop every task of a run without a live claim
        self._outages_seen = self.outbox.retry.outages
        self._restored_at = now
        if self.pending:
            self.outbox.list_wanted(list(self.pending))
        self.owner.after_outage()
        self._grace(now)

    def check_state(self) -> None:
        """Only the first part of a check: was Redis away, is the run's metadata still in Redis?"""
        self.after_outage(time.monotonic())
        if not self.client.exists(keys.meta(self.run_id)):
            self._put_back(time.monotonic(), lost=True)

    def _put_back(self, now: float, lost: bool) -> None:
        """The run's wanted entries, its claim and what the trainer owns written back; workers get a
        lease period to renew their leases before tasks are judged. `lost`: the run's keys are gone
        (FLUSHALL, a Redis restarted without its data): counted, the broker's routing declared again,
        and errors of copies sent before now (no policy, no meta) retried. Else a key was found
        forged (RefusedKeys)."""
        if lost:
            self.stats.state_restored += 1
            self._restored_at = now
            self.outbox.declare_queue()
        else:
            self.refused.due = False
        self.outbox.list_wanted(list(self.pending))
        if self.outbox.claim.held:
            self.outbox.claim.renew()  # a lost claim: until it is back workers drop our tasks
        if lost:
            self.owner.restore_run_state()
        else:
            self.owner.rewrite_owned()
        self._grace(now)

    def _grace(self, now: float) -> None:
        self._grace_until = now + self.lease_seconds
        self.pending.all_seen(now)

    # ---- what workers refused or failed --------------------------------------------------------------
    def unsigned(self, data: bytes, exc: signing.SignatureError) -> None:
        """A result dropped for its signature: forged, or pushed by a worker without the farm's secret
        (or with another one). Nothing in it counts, but the task it names, if pending as that very
        copy, is sent again for the other workers (at most MAX_REFUSALS times), so such a worker
        cannot stall the run; said once per worker it names."""
        try:
            claimed = Result.from_message(codec.unpack(signing.open_result(self.run_id, data, None)))
        except Exception:  # noqa: BLE001 - not even a result: nothing to re-send
            self.owner.warn(f"dropped {exc}")
            return
        worker = str(claimed.worker)[:80]
        p = self.pending.get(claimed.key)
        resend = p is not None and claimed.task_id == p.task_id
        if worker not in self.unsigned_workers:
            self.unsigned_workers.add(worker)
            why = (
                "it has no RLFARM_SECRET"
                if str(claimed.error or "").startswith("NoSecret:")
                else "one without this farm's RLFARM_SECRET, or with another one, or a forgery"
            )
            self.owner.warn(
                f"dropped {exc}; it names worker {worker} ({why}): give every worker the farm's "
                f"secret" + ("; sending its task again to the others" if resend else "")
            )
        if resend:
            refusals = self.pending.refusal(claimed.key)
            if refusals > MAX_REFUSALS:
                raise TaskLostError(f"{describe_key(claimed.key)} came back unsigned {refusals} times; last: {exc}")
            self.resend(claimed.key, f"its result was dropped: {exc}", counted=False)

    def failed(self, key: Key, p: Pending, message: Result) -> None:
        """A copy of a pending task came back without a result: handed back by a worker shutting down,
        refused unrun by a worker of another protocol version, or failed. Sent again unless the
        error says the task cannot succeed (RolloutError) or it was sent too often (TaskLostError)."""
        if message.handed_back:  # its worker is shutting down (SIGTERM): not the task's fault
            if message.task_id == p.task_id:
                self.stats.handed_back += 1
                reason = (
                    f"{describe_key(key)} was handed back by {message.worker}: "
                    f"{(message.error or '').removeprefix('HandedBack: ')}"
                )
                self.owner.warn(f"{reason}; sending it again")
                self.resend(key, reason, counted=False)
            return
        if message.refused:
            self._refused(p, message)
            return
        where = f"{describe_key(key)} failed on {message.worker}: {message.error}"
        self.check_state()  # a task that found no policy or metadata: was the run's state lost?
        if not message.retryable and self._restored_at < p.sent:
            raise RolloutError(where)
        if message.task_id == p.task_id:  # else a newer copy is already on its way
            if message.fault is not None:  # its env's own name for it (rlfarm.errors.EnvFault)
                name = message.fault if EnvFault.NAME.fullmatch(str(message.fault)) else "unnamed"
                self.stats.reported[name] = self.stats.reported.get(name, 0) + 1
            elif message.retryable:
                self.stats.time_limits += 1
            self.owner.warn(f"{where}; sending it again")
            self.resend(key, where)

    def _refused(self, p: Pending, message: Result) -> None:
        """A worker of another protocol version refused the task unrun: warn once per worker, and send
        the task again at the next check (a second later), for the other workers to take."""
        if message.task_id != p.task_id:  # a newer copy is already on its way
            return
        self.stats.refused += 1
        self.pending.refused_unrun(p.spec.key, time.monotonic())
        theirs = message.protocol
        if message.worker not in self.refusing:
            self.refusing[message.worker] = theirs
            self.owner.warn(
                f"worker {message.worker} speaks rlfarm protocol {theirs}, this trainer "
                f"{PROTOCOL}: it refuses this run's tasks, which go to the other workers; "
                f"upgrade it to this trainer's rlfarm"
            )

    def unverified(self, key: Key, p: Pending | None, message: Result) -> None:
        """A worker refused the task's policy, run metadata or spec: written by someone without the
        farm's secret (the worker's own report is signed). Counted and warned about; the trainer puts
        back its own copy, and the task is sent again, so one forged write does not end the run."""
        self.stats.unverified[message.unverified] += 1
        where = f"{describe_key(key)} was refused on {message.worker}: {message.error}"
        repaired = self.owner.write_back(message.unverified)
        if repaired is None:  # nobody holds a genuine copy to put back
            raise RolloutError(where.replace(" was refused on ", " failed on ", 1))
        if p is not None and message.task_id == p.task_id:  # else a newer copy is already on its way
            refusals = self.pending.refusal(key)
            if refusals > MAX_REFUSALS:
                raise TaskLostError(f"{describe_key(key)} was refused {refusals} times; last: {where}")
            self.owner.warn(f"{where}; {repaired}sending it again")
            # Not counted: the report is signed, so it comes from a worker holding the farm's secret,
            # and what it refused was written by someone who does not.
            self.resend(key, where, counted=False)
        else:
            self.owner.warn(f"{where}; {repaired}".rstrip("; "))

"""The run's pending tasks, owned by one object: `TaskLedger`.

Every task sent stays in the ledger under its key (kind, iteration, index) until its first result is
accepted. What is known of each (`Pending`: its newest copy, when it was last seen alive, when it
started, its copies, refusals and backups) changes only through the ledger's methods: a `Pending` is
frozen, so the task channel (which opens and settles entries) and the watchdog (which judges them and
decides what to re-send and when to give up) read it, and say to the ledger what they saw. The
ledger also keeps what the tasks' answers taught: the longest duration of each kind (time limits)
and when a task last finished (stall and idle notices).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass

from rlfarm.core.protocol import Key, TaskSpec


def describe_key(key: Key) -> str:
    return f"task {key[0]} (iteration {key[1]}, index {key[2]})"


@dataclass(frozen=True)
class Pending:
    spec: TaskSpec
    task_id: str  # the newest copy's Celery task id
    last_seen: float  # when it was last known alive: sent, seen queued, or leased
    sent: float = 0.0  # when the newest copy was sent
    copies: int = 1  # copies that count towards farm.max_redispatch
    started: float | None = None  # when a lease was first seen for it (None: not started yet)
    backups: int = 0  # straggler copies sent
    lease_gone: float | None = None  # when its lease was first seen gone while results waited
    reason: str = ""  # why it was last re-sent
    refused: float | None = None  # when a worker of another protocol refused it (re-sent at the next check)
    refusals: int = 0  # copies refused or dropped as unsigned (Result.unverified, a forged signature)
    unwanted_since: float | None = None  # when it was first seen out of `wanted` with no result waiting


class TaskLedger:
    """The pending tasks of one run: opened when first sent, settled by their first accepted result."""

    def __init__(self) -> None:
        self._tasks: dict[Key, Pending] = {}
        self.longest: dict[str, float] = {}  # longest task duration seen, per kind
        self.last_finish = time.monotonic()  # a task finished, or tasks were sent to an idle farm

    # ---- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._tasks)

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def __contains__(self, key: object) -> bool:
        return key in self._tasks

    def __iter__(self) -> Iterator[Key]:
        return iter(list(self._tasks))  # a copy: entries may be settled while one iterates

    def __getitem__(self, key: Key) -> Pending:
        return self._tasks[key]

    def get(self, key: Key) -> Pending | None:
        return self._tasks.get(key)

    def values(self) -> list[Pending]:
        return list(self._tasks.values())

    def count(self, kind: str | None = None) -> int:
        """Pending tasks, of `kind` only when given."""
        if kind is None:
            return len(self._tasks)
        return sum(1 for key in self._tasks if key[0] == kind)

    # ---- a task's copies -------------------------------------------------------------------------
    def open(self, spec: TaskSpec, task_id: str, now: float) -> None:
        """The first copy of `spec` was sent."""
        if not self._tasks:  # nothing was running: the wait for a finished task starts now
            self.last_finish = now
        self._tasks[spec.key] = Pending(spec, task_id, now, sent=now)

    def copied(self, key: Key, task_id: str, reason: str, *, backup: bool, counted: bool, now: float) -> Pending:
        """Another copy of a pending task was sent: `counted` towards max_redispatch, a straggler's
        `backup` (the next backup, if any, only another task_timeout later), or neither."""
        p = self._tasks[key]
        self._tasks[key] = p = dataclasses.replace(
            p,
            task_id=task_id,
            copies=p.copies + counted,
            reason=reason,
            refused=None,
            last_seen=now,
            sent=now,
            lease_gone=None,
            backups=p.backups + backup,
            started=now if backup else None,
        )
        return p

    def settle(self, key: Key, duration: float | None, now: float) -> Pending:
        """The task's first result was accepted: it leaves the ledger, and its duration is learned."""
        p = self._tasks.pop(key)
        self.last_finish = now
        if duration is not None:
            self.longest[key[0]] = max(self.longest.get(key[0], 0.0), float(duration))
        return p

    # ---- what the watchdog saw ----------------------------------------------------------------------
    def _update(self, key: Key, **changes: object) -> Pending:
        self._tasks[key] = p = dataclasses.replace(self._tasks[key], **changes)
        return p

    def seen(self, key: Key, now: float) -> None:
        """Known alive now (its message is queued)."""
        self._update(key, last_seen=now)

    def all_seen(self, now: float) -> None:
        """Every task known alive now: a grace period after Redis was away or lost the run's state."""
        for key in self._tasks:
            self._update(key, last_seen=now)

    def leased(self, key: Key, now: float) -> Pending:
        """A worker holds its lease: alive, started (when first seen so)."""
        p = self._tasks[key]
        return self._update(key, last_seen=now, lease_gone=None, started=now if p.started is None else p.started)

    def lease_missing(self, key: Key, now: float) -> float:
        """Its lease is gone while results wait to be read: since when it has been (first seen now)."""
        p = self._tasks[key]
        return self._update(key, lease_gone=p.lease_gone or now).lease_gone  # type: ignore[return-value]

    def unwanted(self, key: Key, now: float | None) -> Pending:
        """Out of the run's `wanted` set with nothing waiting since `now` (None: its result waits, or a
        worker runs it)."""
        p = self._tasks[key]
        since = None if now is None else (p.unwanted_since if p.unwanted_since is not None else now)
        return self._update(key, unwanted_since=since)

    def refused_unrun(self, key: Key, now: float) -> None:
        """A worker of another protocol version refused it: sent again at the next check."""
        self._update(key, refused=now)

    def refusal(self, key: Key) -> int:
        """A copy was refused as unsigned, or its result dropped as such: how many have been."""
        return self._update(key, refusals=self._tasks[key].refusals + 1).refusals

"""Sending task specs to the farm and taking in their results.

Results arrive on the run's Redis list (see rlfarm.worker); BLPOP wakes the trainer the moment one
lands, without polling each pending task. Every task sent stays pending under its key
(kind, iteration, index) until its first result is accepted. A task whose result has not come back
by its deadline is sent again with the same spec (tasks are deterministic, so any copy is as good as
another); the first copy counts and later copies are dropped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import redis
from celery import Celery

from rlfarm import codec
from rlfarm.celery_app import task_label, task_name
from rlfarm.worker import results_key

Key = tuple[str, int, int]


class RolloutError(RuntimeError):
    """A task failed on its worker (bad env, missing policy version, ...): its message says why."""


class TaskLostError(RuntimeError):
    """A task was dispatched max_redispatch + 1 times without a result."""


def task_key(spec_or_message: dict[str, Any]) -> Key:
    m = spec_or_message
    return (m.get("kind", "rollout"), m.get("iteration"), m.get("index"))


@dataclass
class Pending:
    spec: dict[str, Any]
    deadline: float
    copies: int = 1


@dataclass
class DispatchStats:
    dispatched: int = 0
    redispatched: int = 0
    duplicates: int = 0  # results dropped because their key had already counted
    received: int = 0
    accepted: int = 0
    receive_seconds: float = 0.0  # trainer CPU time spent decoding results
    task_ids: dict[Key, list[str]] = field(default_factory=dict)
    accepted_task_ids: list[str] = field(default_factory=list)


class Dispatcher:
    def __init__(self, app: Celery, client: redis.Redis, run_id: str, task_timeout: float,
                 max_redispatch: int, on_event: Callable[[], None] | None = None, env: str | None = None):
        self.app = app
        self.env = env  # the run's env id, sent as a label for Flower (workers take it from the run)
        self.client = client
        self.run_id = run_id
        self.key = results_key(run_id)
        self.task_timeout = task_timeout
        self.max_redispatch = max_redispatch
        self.on_event = on_event or (lambda: None)
        self.stats = DispatchStats()
        self.pending: dict[Key, Pending] = {}

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def _send(self, spec: dict[str, Any]) -> str:
        kwargs = {"run": self.run_id, **spec}
        if self.env is not None:
            kwargs["env"] = self.env
        # kwargsrepr is what Flower and worker events show: a short label instead of the dict repr.
        result = self.app.send_task(task_name(spec.get("kind", "rollout")), kwargs=kwargs,
                                    kwargsrepr=task_label(kwargs))
        self.stats.dispatched += 1
        self.stats.task_ids.setdefault(task_key(spec), []).append(result.id)
        return result.id

    def submit(self, spec: dict[str, Any]) -> Key:
        key = task_key(spec)
        if key in self.pending:
            raise ValueError(f"task {key} is already in flight")
        self._send(spec)
        self.pending[key] = Pending(spec, time.monotonic() + self.task_timeout)
        self.on_event()
        return key

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """One decoded message of any kind, or None when none arrived within `timeout` seconds."""
        item = self.client.blpop([self.key], timeout=max(timeout, 0.001))
        if item is None:
            return None
        t0 = time.process_time()
        message = codec.unpack(item[1])
        self.stats.receive_seconds += time.process_time() - t0
        self.stats.received += 1
        return message

    def next_result(self, timeout: float) -> dict[str, Any] | None:
        """The next first-copy result of a pending task, or None (nothing came, or a duplicate).

        Waits at most `timeout` (less if a deadline falls sooner) and re-sends overdue tasks.
        """
        if self.pending:
            timeout = min(timeout, max(min(p.deadline for p in self.pending.values()) - time.monotonic(),
                                       0.01))
        message = self.receive(timeout)
        self._resend_overdue()
        if message is None:
            return None
        key = task_key(message)
        if key not in self.pending:
            self.stats.duplicates += 1  # a late copy of a task that already counted
            return None
        if "error" in message:
            raise RolloutError(f"task {key[0]} (iteration {key[1]}, index {key[2]}) failed on "
                               f"{message.get('worker')}: {message['error']}")
        del self.pending[key]
        self.stats.accepted += 1
        self.stats.accepted_task_ids.append(message["task_id"])
        self.on_event()
        return message

    def _resend_overdue(self) -> None:
        now = time.monotonic()
        for key, p in self.pending.items():
            if p.deadline > now:
                continue
            if p.copies > self.max_redispatch:
                raise TaskLostError(
                    f"task {key[0]} (iteration {key[1]}, index {key[2]}) sent {p.copies} times without a "
                    f"result within {self.task_timeout:g} s each: are workers running and connected "
                    f"to the same Redis?")
            self._send(p.spec)
            self.stats.redispatched += 1
            p.copies += 1
            p.deadline = now + self.task_timeout

    def gather_group(self, specs: list[dict[str, Any]],
                     on_other: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """SYNC: dispatch every spec, return their results ordered as `specs` (not by arrival).

        Results of other pending tasks (evaluations) that arrive meanwhile go to `on_other`.
        """
        keys = [self.submit(s) for s in specs]
        wanted = set(keys)
        results: dict[Key, dict[str, Any]] = {}
        while len(results) < len(keys):
            message = self.next_result(timeout=1.0)
            if message is None:
                continue
            key = task_key(message)
            if key in wanted:
                results[key] = message
            elif on_other is not None:
                on_other(message)
        return [results[k] for k in keys]

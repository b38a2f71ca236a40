"""Sending rollout specs to the farm and gathering their results.

Results arrive on the run's Redis list (see rlfarm.worker); BLPOP wakes the trainer the moment one
lands, without polling each pending task. A task whose result has not come back by its deadline is
sent again with the same spec (tasks are deterministic, so any copy is as good as another); the first
copy of each (iteration, index) counts and later copies are dropped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import redis
from celery import Celery

from rlfarm import codec
from rlfarm.celery_app import ROLLOUT_TASK
from rlfarm.worker import results_key


class RolloutError(RuntimeError):
    """A task failed on its worker (bad env, missing policy version, ...): its message says why."""


class TaskLostError(RuntimeError):
    """A task was dispatched max_redispatch + 1 times without a result."""


@dataclass
class DispatchStats:
    dispatched: int = 0
    redispatched: int = 0
    duplicates: int = 0  # results dropped because their (iteration, index) had already counted
    received: int = 0
    receive_seconds: float = 0.0  # trainer CPU time spent decoding results
    task_ids: dict[tuple[int, int], list[str]] = field(default_factory=dict)


class Dispatcher:
    def __init__(self, app: Celery, client: redis.Redis, run_id: str, task_timeout: float,
                 max_redispatch: int, on_event: Callable[[], None] | None = None):
        self.app = app
        self.client = client
        self.run_id = run_id
        self.key = results_key(run_id)
        self.task_timeout = task_timeout
        self.max_redispatch = max_redispatch
        self.on_event = on_event or (lambda: None)
        self.stats = DispatchStats()
        self.in_flight = 0

    def send(self, spec: dict[str, Any]) -> str:
        result = self.app.send_task(ROLLOUT_TASK, kwargs={"run": self.run_id, **spec})
        self.stats.dispatched += 1
        self.stats.task_ids.setdefault((spec["iteration"], spec["index"]), []).append(result.id)
        return result.id

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """One decoded result, or None when none arrived within `timeout` seconds."""
        item = self.client.blpop([self.key], timeout=max(timeout, 0.001))
        if item is None:
            return None
        t0 = time.process_time()
        message = codec.unpack(item[1])
        self.stats.receive_seconds += time.process_time() - t0
        self.stats.received += 1
        return message

    def gather_group(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """SYNC: dispatch every spec, return their results ordered by index (not arrival)."""
        iteration = specs[0]["iteration"]
        pending = {s["index"]: s for s in specs}
        deadline = {}
        copies = {}
        for s in specs:
            self.send(s)
            deadline[s["index"]] = time.monotonic() + self.task_timeout
            copies[s["index"]] = 1
        self.in_flight = len(pending)
        self.on_event()
        results: dict[int, dict[str, Any]] = {}
        while pending:
            wait = min(deadline[i] for i in pending) - time.monotonic()
            message = self.receive(timeout=min(max(wait, 0.01), 1.0))
            if message is not None:
                index = message.get("index")
                if message.get("iteration") != iteration or index not in pending:
                    self.stats.duplicates += 1  # a late copy of a task that already counted
                elif message["kind"] == "error":
                    raise RolloutError(f"rollout task (iteration {iteration}, index {index}) failed on "
                                       f"{message.get('worker')}: {message['error']}")
                else:
                    results[index] = message
                    del pending[index]
                    self.in_flight = len(pending)
                    self.on_event()
            now = time.monotonic()
            for index in [i for i in pending if deadline[i] <= now]:
                if copies[index] > self.max_redispatch:
                    raise TaskLostError(
                        f"rollout task (iteration {iteration}, index {index}) sent {copies[index]} times "
                        f"without a result within {self.task_timeout:g} s each: are workers running "
                        f"and connected to the same Redis?")
                self.send(pending[index])
                self.stats.redispatched += 1
                copies[index] += 1
                deadline[index] = now + self.task_timeout
        return [results[s["index"]] for s in specs]

"""What a worker's main process (its Celery node) does for its running tasks, beside Celery: the
tasks themselves run in pool processes (rlfarm.worker.handler), which a hung env or a SIGKILL can
stop at any moment, so what must not depend on them is done from here.

- Leases (`LeaseKeeper`): the lease of each running task is renewed from here too. A pool process
  renews its own from a thread, but an env hung in C code that holds the GIL stops every thread of
  its process: the lease expired and the task was taken for a lost worker, while its time limit
  never spoke. From here only PEXPIRE is sent: it extends a lease the task took and never creates
  one, so a task that has pushed its result (deleting its lease) is never shown as running.
- Hand-back (`hand_back`): on SIGTERM (a spot instance's notice, `docker stop`) each running task is
  answered at once with a `handed_back` result and its lease deleted, in one transaction, so the
  trainer sends it again immediately instead of waiting for the worker to finish or its lease to
  expire. A pool process normally does this itself (rlfarm.worker.handler.HandedBack, on SIGUSR2
  from here); this module does it for those that did not within `--shutdown-grace` and are then
  killed.

The tasks are plain `NodeTask`s, so nothing here knows Celery (rlfarm.worker.hooks is the glue).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.farm import keys, redis_url
from rlfarm.farm.delivery import deliver
from rlfarm.farm.policies.store import PolicyStore
from rlfarm.farm.shares import register_node

HAND_BACK_SIGNAL = signal.SIGUSR2  # main -> pool process: hand your task back now


@dataclass(frozen=True)
class NodeTask:
    """A running rlfarm task as the node's main process sees it."""

    task_id: str
    run: str
    kind: str
    iteration: int
    index: int
    pid: int | None  # the pool process running it
    env: str | None = None

    @property
    def key_text(self) -> str:
        return keys.task(self.kind, self.iteration, self.index)


def task_of(task_id: str, kwargs: dict | None, pid: int | None) -> NodeTask | None:
    """A NodeTask from a Celery request's kwargs (None: not an rlfarm task)."""
    if not kwargs or "run" not in kwargs:
        return None
    return NodeTask(
        task_id,
        kwargs["run"],
        kwargs.get("kind", "rollout"),
        kwargs.get("iteration"),
        kwargs.get("index"),
        pid,
        kwargs.get("env"),
    )


def client_for(url: str) -> redis.Redis:
    """A client that answers or fails within seconds: a shutting-down worker must not wait out a
    Redis outage (its tasks' leases expire and the trainer re-sends them anyway)."""
    return redis_url.client(url, socket_connect_timeout=3, socket_timeout=3)


def hand_back_reason(node: str, detail: str = "") -> str:
    return f"HandedBack: worker {node} is shutting down (SIGTERM){detail}"


def push_handed_back(client: redis.Redis, task: NodeTask, worker: str, reason: str) -> None:
    """The task's `handed_back` answer and its lease's deletion, in one transaction (nothing but the
    deletion once its run ended)."""
    message = Result(
        task.kind,
        task.iteration,
        task.index,
        task_id=task.task_id,
        worker=worker,
        error=reason,
        retryable=True,
        handed_back=True,
    ).to_message()
    payload = signing.seal_result(task.run, codec.pack(message), signing.secret_from_env())
    deliver(client, task.run, payload, delete=(keys.lease(task.run, task.key_text),))


def ask_to_hand_back(tasks: list[NodeTask]) -> None:
    """SIGUSR2 to the pool processes running `tasks`: each pushes its task's hand-back itself."""
    for task in tasks:
        if task.pid:
            try:
                os.kill(task.pid, HAND_BACK_SIGNAL)
            except ProcessLookupError:
                pass


def force_hand_back(client: redis.Redis, tasks: list[NodeTask], node: str, grace: float) -> None:
    """For pool processes that did not let go of their task within the grace period (an env stuck in
    C code): answer for them, then SIGKILL them so the worker can exit."""
    worker = f"{node} (worker main process {os.getpid()} on {socket.gethostname()})"
    for task in tasks:
        try:
            push_handed_back(
                client,
                task,
                worker,
                hand_back_reason(
                    node,
                    f"; its pool process {task.pid} did not let go of the task within --shutdown-grace "
                    f"{grace:g} s and was killed",
                ),
            )
        except redis.RedisError:
            pass  # the lease expires by itself and the trainer re-sends the task then
        if task.pid:
            try:
                os.kill(task.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class LeaseKeeper(threading.Thread):
    """Renews the leases of the node's running tasks (`running()`), at a quarter of each run's
    `farm.lease_seconds`, from the worker's main process (see the module docstring). With `node`, it
    also keeps the node's `slots` registered for the farm's fair shares (rlfarm.farm.shares)."""

    def __init__(self, url: str, running: Callable[[], list[NodeTask]], node: str | None = None, slots: int = 0):
        super().__init__(name="rlfarm-lease-keeper", daemon=True)
        self.client = client_for(url)
        self.running = running
        self.node, self.slots = node, slots
        self.lease_ms: dict[str, int] = {}  # run -> its lease expiry in ms, from its metadata

    def _lease_ms(self, run: str) -> int | None:
        if run not in self.lease_ms:
            try:  # signed metadata is verified (RLFARM_SECRET), as the pool processes do
                farm = PolicyStore(self.client, run).run_meta()["config"]["farm"]
            except Exception:  # noqa: BLE001 - unknown run, Redis away: the pool process's own renewal
                return None
            if len(self.lease_ms) > 64:
                self.lease_ms.clear()
            self.lease_ms[run] = max(int(float(farm.get("lease_seconds", 10.0)) * 1000), 100)
        return self.lease_ms[run]

    def renew(self) -> float:
        """One round; returns the seconds until the next."""
        interval = 1.0
        pipe = self.client.pipeline(transaction=False)
        for task in self.running():
            ms = self._lease_ms(task.run)
            if ms:
                pipe.pexpire(keys.lease(task.run, task.key_text), ms)
                interval = min(interval, ms / 4000)
        pipe.execute()
        return interval

    def run(self) -> None:
        while True:
            try:
                if self.node:
                    register_node(self.client, self.node, self.slots)
                interval = self.renew()
            except Exception:  # noqa: BLE001 - a Redis outage: the trainer gives leases a grace period after it
                interval = 1.0
            time.sleep(interval)  # the renewal period, as the pool process's lease thread keeps it

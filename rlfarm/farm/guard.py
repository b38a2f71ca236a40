"""A run's keys hold what the run wrote: a key whose Redis type is not the registry's (rlfarm.farm.keys
TYPES) was written by someone else, and a command on it fails with WRONGTYPE. Before, that error ended
the trainer with a traceback: one `SET rlfarm:<run>:wanted x` by anyone who can reach Redis was enough.

`GuardedRetry` is the trainer's outage clock (rlfarm.farm.outage) that also answers WRONGTYPE: it
deletes the run's keys of the wrong type (`KeyGuard.repair`), counts and reports them, and runs the
command again, which writes the key anew; the trainer then writes back the rest of what it owns
(`notify` reaches the trainer's `RefusedKeys`, and its watchdog has it write back). Commands the
trainer sends are idempotent (SET, SADD, ZADD, HSET, DEL, GET, LPOP of a list that did not exist), so
running one again after a repair is safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from rlfarm.farm import keys
from rlfarm.farm.outage import OutageRetry, resilient_client


def is_wrong_type(error: BaseException) -> bool:
    return isinstance(error, redis.ResponseError) and "WRONGTYPE" in str(error)


def delete_wrong_types(client: redis.Redis, names: list[str]) -> list[tuple[str, str, str]]:
    """Delete those of `names` whose Redis type is not the registry's; (key, type, expected) of each."""
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.type(name)
    found = []
    for name, kind in zip(names, pipe.execute()):
        kind = kind.decode() if isinstance(kind, bytes) else kind
        expected = keys.expected_type(name)
        if expected is not None and kind not in ("none", expected):
            found.append((name, kind, expected))
    if found:
        client.delete(*[name for name, _, _ in found])
    return found


class KeyGuard:
    """Finds and deletes `run`'s keys (and the farm's) whose type is not the registry's."""

    def __init__(self, run_id: str, notify: Callable[[str], None] = lambda text: None):
        self.run_id = run_id
        self.notify = notify
        self.client: redis.Redis | None = None  # set once the client exists (it carries this guard)

    def repair(self) -> bool:
        """Delete the keys of the wrong type; True if there were any (the failed command may run again)."""
        assert self.client is not None
        names = [
            k.decode() if isinstance(k, bytes) else k
            for k in self.client.scan_iter(match=keys.run_pattern(self.run_id), count=1000)
        ]
        found = delete_wrong_types(self.client, names + list(keys.FARM_TYPES))
        for name, kind, expected in found:
            self.notify(
                f"refused {name}: a {kind} where the run keeps a {expected} (written by someone "
                f"else, e.g. without RLFARM_SECRET); deleted it, the trainer writes its own back"
            )
        return bool(found)


class GuardedRetry(OutageRetry):
    """OutageRetry that also repairs a WRONGTYPE answer (see the module docstring) and tries again."""

    def __init__(self, *args: Any, guard: KeyGuard | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.guard = guard
        # One repair at a time; a thread whose command failed while another repaired finds the repair
        # done (`_repairs` moved on) and runs its command again instead of repairing nothing and failing.
        self._repair_lock = threading.Lock()
        self._repairs = 0
        self._repairing = threading.local()  # the repair's own commands go through this client too

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # type: ignore[override]
        repairs_before = self._repairs
        try:
            return super().call_with_retry(do, fail, is_retryable, with_failure_count)
        except redis.ResponseError as error:
            if self.guard is None or getattr(self._repairing, "value", False) or not is_wrong_type(error):
                raise
            with self._repair_lock:
                repaired = self._repairs != repairs_before or self._repair()
            if not repaired:
                raise
            return super().call_with_retry(do, fail, is_retryable, with_failure_count)

    def _repair(self) -> bool:
        assert self.guard is not None
        self._repairing.value = True
        try:
            repaired = self.guard.repair()
        finally:
            self._repairing.value = False
        self._repairs += repaired
        return repaired


def guarded_client(
    url: str, run_id: str, timeout: float, *, where: str, warn: Callable[[str], None], refused: Callable[[str], None]
) -> tuple[redis.Redis, GuardedRetry]:
    """The trainer's client of the farm at `url` and its outage clock: every command waits out an outage
    of up to `timeout` seconds (`warn` says so), and a key of run `run_id` of the wrong type is deleted
    and told to `refused`. The client carries the guard in its retry and the guard repairs through
    the client: the two are made together here, and nothing else wires them."""
    guard = KeyGuard(run_id, notify=refused)
    retry = GuardedRetry(timeout, where=where, notify=warn, guard=guard)
    client = resilient_client(url, retry)
    guard.client = client
    return client, retry

"""A running task's lease, held by its pool process (the main process renews it too: rlfarm.worker.main_process)."""

from __future__ import annotations

import logging
import threading

import redis

log = logging.getLogger("rlfarm.worker")


class Lease:
    """Holds `rlfarm:<run>:lease:<task>` while a task runs: set with a short expiry and renewed from a
    thread, so the trainer can tell a task that is running (however long) from one whose worker died
    (the lease expires within `seconds`). A hung env keeps renewing; the task's time limit ends it.

    One per worker process, whose thread is started by the first task and kept: a thread started
    and joined for every task cost each task 0.3-0.5 ms on an idle machine and several ms on a busy
    one (benchmarks/task_cost.py, scale.py), more than the rest of its checks. A renewal racing the
    result's push may set the key once more after the push deleted it, as a renewal in flight always
    could; it expires within `seconds`, and the trainer looks at leases of tasks still wanted only."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self._held: tuple[str, str, int] | None = None  # key, holder, expiry in ms
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def hold(self, key: str, holder: str, seconds: float) -> None:
        """Set the lease now and renew it until `release` (or the next `hold`)."""
        ms = max(int(seconds * 1000), 100)
        self.client.set(key, holder, px=ms)
        with self._changed:
            self._held = (key, holder, ms)
            self._changed.notify()
        if self._thread is None or not self._thread.is_alive():  # first task (of this forked process)
            self._thread = threading.Thread(target=self._renew, name="rlfarm-lease", daemon=True)
            self._thread.start()

    def release(self) -> None:
        """Stop renewing; the key itself is deleted with the result (rlfarm.worker.results.push)."""
        with self._changed:
            self._held = None
            self._changed.notify()

    def _renew(self) -> None:
        while True:
            with self._changed:
                while self._held is None:
                    self._changed.wait()
                held = self._held
                self._changed.wait(held[2] / 4000)
                if self._held is not held:  # released or replaced meanwhile: look again
                    continue
            try:
                self.client.set(held[0], held[1], px=held[2])
            except Exception as exc:  # noqa: BLE001 - the task goes on; an outage may outlast the lease
                log.warning("cannot renew lease %s: %s", held[0], exc)

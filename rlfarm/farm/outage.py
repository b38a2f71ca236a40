"""Riding out a Redis outage: every command is retried with back-off until Redis answers again or
the outage has lasted longer than a limit.

A farm's Redis gets restarted (upgrades, a container moved, a crash with an append-only file); that
must cost the run a pause, not the run. `OutageRetry` plugs into redis-py's retry hook, so every
command and pipeline of a client waits out the outage transparently, with one clock per client:
the outage starts at the first failure of any command and ends at the first success. Past `limit`
seconds it raises `RedisUnavailable`, which the CLI turns into one line and a non-zero exit (the run
stays resumable from its checkpoint). `run()` applies the same clock to calls outside redis-py
(Celery's publisher, which has its own short retry policy and then gives up).

An outage is named for what it is: "unreachable" when connections fail (refused, reset, no route)
or when a command timed out and a fresh TCP connection to Redis's address fails too (a network
partition that drops packets looks like a timeout from inside an open connection); "stalled" only
when a command timed out while Redis still accepts connections (a slow command, a fork for a save,
a paused server). `outage_kind` is that decision; `can_connect` the probe.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rlfarm.errors import RedisUnavailable

T = TypeVar("T")

# What an outage looks like to a client: refused or reset connections, timeouts, a Redis still
# loading its append-only file (BusyLoadingError is a ConnectionError).
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    socket.timeout,
    ConnectionError,
)
# Answers, not outages: a wrong password stays wrong however long we wait.
NOT_OUTAGES: tuple[type[BaseException], ...] = (redis.AuthenticationError,)
# No answer within a timeout: either Redis is busy with the connection open (a slow command, a fork
# for a save, DEBUG SLEEP, a paused container) or a partition drops the packets; `outage_kind` tells
# which, so an operator looks in the right place.
STALL_ERRORS: tuple[type[BaseException], ...] = (redis.TimeoutError, socket.timeout, TimeoutError)
PROBE_SECONDS = 1.0  # a fresh TCP connect to a Redis that listens takes milliseconds, even to a stalled one
NOTICE_SECONDS = 10.0  # while an outage lasts, say so this often
DEFAULT_LIMIT = 120.0  # seconds; `farm.redis_outage_timeout` for trainers, RLFARM_REDIS_OUTAGE_TIMEOUT for workers


def outage_kind(error: BaseException, reachable: bool | None) -> str:
    """ "stalled" or "unreachable": what an outage that began with `error` is. `reachable`: whether a
    fresh TCP connection to Redis's address succeeded right after (None: no probe could be made).

    A failed connection is unreachable. A timeout means the connection stayed open and no answer
    came: Redis is stalled if it still accepts a new connection; if that fails too, the timeout was
    a partition (packets dropped, a link down) and Redis is unreachable."""
    if not isinstance(error, STALL_ERRORS) or connect_timed_out(error):
        return "unreachable"
    return "unreachable" if reachable is False else "stalled"


def connect_timed_out(error: BaseException) -> bool:
    """redis-py's "Timeout connecting to server": no connection was made at all, which a stalled
    Redis (whose kernel still accepts into its backlog) never causes. The probe after it may already
    succeed if the link came back in between; the error itself is the better witness."""
    return "connecting" in str(error).lower()


def can_connect(address: tuple[str, int] | str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether a new TCP (or Unix socket) connection to `address` is accepted within `timeout` s. Only
    the connect: a stalled Redis's kernel still accepts connections into its backlog."""
    try:
        if isinstance(address, str):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
        else:
            socket.create_connection(address, timeout=timeout).close()
    except OSError:
        return False
    return True


class OutageRetry(Retry):
    """redis-py Retry that retries for up to `limit` seconds of outage instead of a number of times.

    `notify(text)` is called once when an outage starts and once when it ends (console or log).
    Copies share one state: redis-py deep-copies its Retry into every connection, and an outage is a
    property of the server, not of one connection. Threads share it too (the trainer's claim, share
    and ingest threads use its client): a lock makes each failure's and recovery's reading and
    writing of the outage one step, so one thread's recovery never ends an outage halfway through
    another's failure (a CI run caught `now - None` there).
    """

    def __init__(
        self,
        limit: float = DEFAULT_LIMIT,
        where: str = "Redis",
        notify: Callable[[str], None] | None = None,
        max_backoff: float = 2.0,
    ):
        super().__init__(ExponentialBackoff(cap=max_backoff, base=0.05), retries=-1, supported_errors=OUTAGE_ERRORS)
        self.limit = limit
        self.where = where
        self.notify = notify or (lambda text: None)
        self.enabled = True
        self.outage_started: float | None = None
        self._stall = False  # the current outage began with a timeout, not a lost connection
        self._last_notice = 0.0
        # redis-py runs a reconnect under the same Retry inside a command's retry: only the outermost
        # call of a thread may end an outage (a TCP connect to a stalled Redis succeeds at once).
        self._depth = threading.local()
        # Re-entrant: `notify` may log through a handler that itself uses a client with this clock.
        self._lock = threading.RLock()
        self.outages = 0  # outages ridden out so far (a trainer re-checks its run state after each)
        # Commands that failed and were sent again: one whose reply was lost may have run twice
        # (rlfarm.trainer.ingest reconciles its BLMOVE when this moved under it).
        self.failures = 0
        self.recovered_at = float("-inf")  # when the last outage ended (monotonic)
        self.outage_seconds = 0.0
        # Whether Redis accepts a new connection right now (set by resilient_client, which knows the
        # address): tells a partition from a stall when a command times out.
        self.probe: Callable[[], bool] | None = None

    def __deepcopy__(self, memo: dict) -> OutageRetry:
        return self

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def _failed(self, error: BaseException, failures: int, attempt_started: float) -> None:
        if is_oom(error):  # kombu may wrap Redis's answer in its own error: it is no outage
            raise error
        with self._lock:  # the back-off sleeps outside it
            self.failures += 1
            self._count_failure(error, attempt_started)
        time.sleep(self._backoff.compute(failures))

    def _count_failure(self, error: BaseException, attempt_started: float) -> None:
        """Start the outage's clock, or say that it goes on; RedisUnavailable past the limit."""
        now = time.monotonic()
        if self.outage_started is None and attempt_started < self.recovered_at:
            # Sent while the outage that has just ended lasted (another thread saw Redis back first):
            # a connect or command lost to that partition (a SYN dropped mid-backoff times out after
            # the heal), not a new outage; retried without a notice.
            return
        if self.outage_started is None:
            timed_out = isinstance(error, STALL_ERRORS)
            reachable = self.probe() if timed_out and self.probe is not None else None
            self._stall = outage_kind(error, reachable) == "stalled"
            self._last_notice = now
            if self._stall:  # Redis has not answered since the attempt was sent
                self.outage_started = attempt_started
                self.notify(
                    f"{self.where} did not answer for {now - attempt_started:.0f} s "
                    f"({type(error).__name__}: {error}): it is stalled (a slow command, a save, "
                    f"a paused or overloaded server), not gone; waiting for up to {self.limit:g} s"
                )
            elif timed_out:  # no answer, and no new connection either: cut off since the attempt was sent
                self.outage_started = attempt_started
                self.notify(
                    f"lost {self.where}: no answer for {now - attempt_started:.0f} s "
                    f"({type(error).__name__}: {error}) and a new connection failed within "
                    f"{PROBE_SECONDS:g} s: it is unreachable (a network partition, a link or host "
                    f"down); retrying for up to {self.limit:g} s"
                )
            else:
                self.outage_started = now
                self.notify(
                    f"lost {self.where} ({type(error).__name__}: {error}): it is unreachable; "
                    f"retrying for up to {self.limit:g} s"
                )
        elif now - self._last_notice >= NOTICE_SECONDS and now - self.outage_started <= self.limit:
            self._last_notice = now
            self.notify(f"still waiting for {self.where}: {now - self.outage_started:.0f} s of {self.limit:g} s")
        if now - self.outage_started > self.limit:
            # The clock keeps running until Redis answers (`_recovered`): the trainer's claim and share
            # threads share this object, and one of them giving up must not restart the main thread's
            # clock, which then never reached the limit and retried forever.
            what = "did not answer" if self._stall else "unreachable"
            raise RedisUnavailable(
                f"{self.where} {what} for more than {self.limit:g} s (last error: {type(error).__name__}: {error})"
            ) from None

    def _recovered(self) -> None:
        if self.outage_started is None:  # the common case, read without the lock
            return
        with self._lock:
            if self.outage_started is None:  # another thread saw Redis back first
                return
            self.recovered_at = time.monotonic()
            seconds = self.recovered_at - self.outage_started
            self.outage_started = None
            self.outages += 1
            self.outage_seconds += seconds
            if self._stall:
                self.notify(f"{self.where} answered again after {seconds:.1f} s")
            else:
                self.notify(f"{self.where} is back after {seconds:.1f} s")

    def _attempts(
        self,
        fn: Callable[[], T],
        errors: tuple[type[BaseException], ...],
        retryable: Callable[[BaseException], bool] | None = None,
        fail: Callable[[BaseException, int], None] | None = None,
    ) -> T:
        depth = getattr(self._depth, "value", 0)
        self._depth.value = depth + 1
        try:
            failures = 0
            while True:
                started = time.monotonic()
                try:
                    result = fn()
                except errors as error:
                    if isinstance(error, NOT_OUTAGES) or (retryable and not retryable(error)):
                        raise
                    failures += 1
                    if fail is not None:
                        fail(error, failures)
                    self._failed(error, failures, started)
                    continue
                if depth == 0:
                    self._recovered()
                return result
        finally:
            self._depth.value = depth

    def call_with_retry(self, do, fail, is_retryable=None, with_failure_count=False):  # type: ignore[override]
        if not self.enabled:  # one attempt (e.g. best-effort cleanup after the outage limit)
            return do()
        on_fail = (lambda error, n: fail(error, n)) if with_failure_count else (lambda error, n: fail(error))
        return self._attempts(do, self._supported_errors, is_retryable, on_fail)

    def run(self, fn: Callable[[], T], errors: tuple[type[BaseException], ...] = ()) -> T:
        """Call `fn` under the same outage clock, also retrying on `errors` (e.g. kombu's)."""
        if not self.enabled:
            return fn()
        return self._attempts(fn, (*OUTAGE_ERRORS, *errors))


def is_oom(exc: BaseException) -> bool:
    """Redis refused a write because it is at `maxmemory` (with noeviction: it never drops data)."""
    text = str(exc)
    return (
        isinstance(exc, redis.OutOfMemoryError)
        or "OOM command not allowed" in text
        or "used memory > 'maxmemory'" in text
    )


def resilient_client(
    url: str, retry: OutageRetry, connect_timeout: float = 5.0, stall_timeout: float = 10.0
) -> redis.Redis:
    """A client whose commands and pipelines wait out outages under `retry`'s clock.

    `stall_timeout`: seconds without a byte of an answer before a command counts as stalled (set
    here because redis-py's default differs between versions: none in 5.x, 5 s in 8.x). Longer than
    any blocking command rlfarm sends (BLPOP waits at most a second).
    """
    from rlfarm.farm.redis_url import client

    made = client(
        url,
        retry=retry,
        socket_connect_timeout=connect_timeout,
        socket_timeout=stall_timeout,
        socket_keepalive=True,
        health_check_interval=30,
    )
    retry.probe = _prober(made.connection_pool)
    return made


def _prober(pool: redis.ConnectionPool) -> Callable[[], bool]:
    """A probe of the address `pool` connects to: the master the sentinels name now, a Unix socket's
    path, or host and port."""
    master = getattr(pool, "get_master_address", None)
    settings = pool.connection_kwargs

    def probe() -> bool:
        try:
            address = (
                master()
                if master is not None
                else settings.get("path") or (settings.get("host", "localhost"), int(settings.get("port", 6379)))
            )
        except (redis.RedisError, OSError):  # no sentinel names a master: that is unreachable too
            return False
        return can_connect(address)

    return probe

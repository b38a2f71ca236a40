"""Taking results in beside the learner: a thread that moves each result out of the run's Redis list,
checks its signature and decodes it while the trainer's main thread learns (`async.ingest =
"thread"`, the default: decision 30 in docs/architecture.md). The main thread only does the
bookkeeping (which task, whose copy, what the watchdog makes of it), so a learner's minibatch is
never held up by a decode.
zstd's decompression, the HMAC and numpy's copies release the GIL: the decode runs on another core
while torch computes (benchmarks/ingest.py, `--learner`).

Nothing leaves the farm's view on the way. The thread takes a result with BLMOVE from
`rlfarm:<run>:results` to `rlfarm:<run>:taken` (atomic), and the main thread trims it from `taken`
when it takes the decoded result in. So a result is always in one of the two lists until its task is
settled, and the watchdog, which counts both in one pipeline, never takes a finished task for a lost
one. The thread holds at most `prefetch` results, so a learner behind still leaves them in Redis
(back-pressure as before). A BLMOVE whose reply was lost (the connection cut after Redis ran it) is
sent again by the client's outage retry and moves a second result: after any retry the thread reads
what `taken` holds beyond the results it knows of, and takes those in too, in order, so none waits
there unseen until its task is re-sent as lost. An error in the thread (Redis gone past the outage limit, an unreadable
message) is raised in the main thread where the inline path would have raised it.

`keep_freed_memory` is the other half of a fast ingest: a decoded Pong result is 14.6 MB, and by
default glibc hands such blocks back to the kernel when they are freed, so every result paid its
page faults again (benchmarks/ingest.py: most of a Pong result's trainer CPU).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from rlfarm.core import codec, signing
from rlfarm.core.protocol import Result
from rlfarm.farm import keys

if TYPE_CHECKING:
    import redis

PREFETCH = 4  # decoded results the thread holds at most: a few, so decoding is always ahead
WAIT_SECONDS = 0.2  # the thread's longest block in Redis: how soon it notices that it is to stop

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to 32 MiB (glibc's largest heap block) in the process's heap for reuse,
    and up to 1 GiB of free heap before it is trimmed, instead of unmapping and faulting them in again
    for every result. False where the C library is not glibc (musl: nothing changes)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, 32 << 20) and mallopt(_M_TRIM_THRESHOLD, 1 << 30) and mallopt(_M_TOP_PAD, 64 << 20)
    )


class Ingest:
    """The thread that takes the run's results in; `take` hands them to the main thread in order."""

    def __init__(self, client: redis.Redis, run_id: str, secret: Any, prefetch: int = PREFETCH):
        self.client = client
        self.run_id = run_id
        self.secret = secret
        self.results = keys.results(run_id)
        self.taken = keys.taken(run_id)
        # What the thread has moved to `taken` and the main thread has not yet taken in.
        self._room = threading.Semaphore(prefetch)
        self._ready: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        # Results at the head of `taken` that the thread received and the main thread has not trimmed:
        # `taken` beyond them holds only what a BLMOVE moved whose reply was lost.
        self._held = 0
        self._lock = threading.Lock()
        retry = client.get_retry() if hasattr(client, "get_retry") else None
        self._failures = (lambda: retry.failures) if hasattr(retry, "failures") else (lambda: 0)
        # A trainer of this run that died left its taken results behind: their tasks are resent.
        client.delete(self.taken)
        self._thread = threading.Thread(target=self._run, name=f"rlfarm-ingest-{run_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._room.acquire(timeout=WAIT_SECONDS):
                continue
            failures = self._failures()
            try:
                raw = self.client.blmove(self.results, self.taken, WAIT_SECONDS, "LEFT", "RIGHT")
                moved = [raw] if failures == self._failures() else self._moved()
            except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
                self._ready.put(("error", exc, None))
                return
            if not moved or moved == [None]:
                self._room.release()
                continue
            for i, item in enumerate(moved):
                if i:  # a lost reply's result beside this one: room for it is waited for
                    self._room.acquire()
                with self._lock:
                    self._held += 1
                self._ready.put(self._decode(item))

    def _moved(self) -> list[bytes]:
        """What `taken` holds beyond the results the thread received: the result of a BLMOVE whose
        reply was lost, then that of the one sent again (if it moved one)."""
        with self._lock:  # the main thread trims the head meanwhile otherwise
            return self.client.lrange(self.taken, self._held, -1)

    def _decode(self, raw: bytes) -> tuple[str, Any, Any]:
        t0 = time.thread_time()
        try:
            message = codec.unpack(signing.open_result(self.run_id, raw, self.secret))
            result = Result.from_message(message)
        except signing.SignatureError as exc:  # the main thread's watchdog says who sent it
            return ("forged", raw, exc)
        except Exception as exc:  # noqa: BLE001 - as the inline path raises it, in the main thread
            return ("error", exc, None)
        return ("result", result, time.thread_time() - t0)

    def take(self, timeout: float) -> tuple[str, Any, Any] | None:
        """The next result the thread took, as ("result", Result, decode CPU seconds), ("forged", raw
        bytes, SignatureError) or None when none came within `timeout` seconds (0: only one ready).
        Trimmed from `taken` here, in the main thread, so the watchdog never sees it in neither list."""
        try:
            item = self._ready.get(timeout=timeout) if timeout > 0 else self._ready.get_nowait()
        except queue.Empty:
            return None
        if item[0] == "error":
            raise item[1]
        pipe = self.client.pipeline(transaction=False)
        pipe.ltrim(self.taken, 1, -1)
        pipe.expire(self.taken, keys.RESULTS_TTL)  # what a dead trainer leaves goes by itself
        with self._lock:
            pipe.execute()
            self._held -= 1
        self._room.release()
        return item

    def close(self) -> None:
        """Stop the thread (within WAIT_SECONDS); results it held stay in `taken` until the run's keys go."""
        self._stop.set()
        self._thread.join(timeout=5 * WAIT_SECONDS + 5)

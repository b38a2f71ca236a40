"""The run's env streams (`farm.episodes = "continue"`, rlfarm.core.streams), an object the trainer holds:
which snapshot each stream's next task continues from, and which snapshots in Redis no task will read
any more (a superseded one, a late copy's, a finished run's), deleted."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlfarm.core.protocol import Key, Result
from rlfarm.core.streams import SHA256_HEX, StreamBook
from rlfarm.farm import keys

if TYPE_CHECKING:
    import redis

    from rlfarm.trainer.counters import DispatchStats


class RunStreams:
    """The streams of one run: `book` is their StreamBook once a mode opens them (None in "fresh" mode,
    where every task starts its episodes anew). `signed`: the run has a secret, so a snapshot that is
    not its digest's came in a signed spec and is counted as forged in `stats`."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        *,
        continuing: bool,
        signed: bool,
        stats: DispatchStats,
        warn: Callable[[str], None],
    ):
        self.client, self.run_id = client, run_id
        self.continuing, self.signed, self.stats, self.warn = continuing, signed, stats, warn
        self.book: StreamBook | None = None
        self._accepted: dict[Key, str] = {}  # accepted results' snapshots, until their stream advances

    def open(self, count: int) -> None:
        """`count` streams, when the run continues its episodes across tasks."""
        if self.continuing:
            self.book = StreamBook(count)

    def ref(self, index: int) -> dict[str, Any] | None:
        """What a rollout task on stream `index` carries; None in "fresh" mode."""
        return self.book.ref(index) if self.book is not None else None

    def advance(self, message: Result, index: int) -> None:
        """The accepted result of a task on stream `index`: its next task continues from the snapshot
        this one saved; the one before is deleted from Redis (a copy still running of the task just
        accepted is skipped by its worker, so nothing will read it)."""
        if self.book is None:
            return
        self._accepted.pop(message.key, None)
        old, notice = self.book.advance(message.stream, index)
        if notice:
            self.warn(f"run {self.run_id}: {notice}")
        if notice and message.stream.get("forged") and self.signed:
            self.stats.forged_snapshots += 1  # its digest came in a signed spec: a forgery
        if old is not None:
            self.client.delete(keys.stream(self.run_id, old))

    def late_copy(self, message: Result) -> None:
        """A straggler's copy, or an earlier trainer's, pushed its stream's snapshot with its result
        (rlfarm.worker.results), which counts for nothing: deleted, unless a stream stands at it or
        an accepted result names it (a copy continued from the same snapshot with the same seeds
        saves the very same bytes, under the same digest). Before, each stayed its 6 hours."""
        digest = _digest(message)
        if self.book is None or digest is None or not SHA256_HEX.fullmatch(digest):
            return
        if digest in self.book.after or digest in self._accepted.values():
            return
        self.client.delete(keys.stream(self.run_id, digest))
        self.book.stats.late_dropped += 1

    def accepted(self, message: Result) -> None:
        """An accepted result's snapshot, named until its stream advances to it (`advance`)."""
        digest = _digest(message)
        if self.book is not None and digest is not None:
            self._accepted[message.key] = digest

    def drop(self) -> None:
        """A finished run's snapshots (an interrupted one keeps them for --resume; they expire)."""
        if self.book is not None:
            digests = {d for d in self.book.after if d} | set(self._accepted.values())
            names = [keys.stream(self.run_id, d) for d in sorted(digests)]
            if names:
                self.client.delete(*names)


def _digest(message: Result) -> str | None:
    digest = message.stream.get("digest") if isinstance(message.stream, dict) else None
    return digest if isinstance(digest, str) else None

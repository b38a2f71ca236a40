"""The trainer's env streams (`farm.episodes = "continue"`, rlfarm.core.streams): which snapshot each
stream's next task continues from, and which snapshots in Redis no task will read any more (a
superseded one, a late copy's, a finished run's), deleted. The trainer's `streams` (its StreamBook,
None in "fresh" mode), `client`, `store`, `channel`, `config` and `warn` are the Trainer's."""

from __future__ import annotations

from typing import Any

from rlfarm.core.protocol import Result
from rlfarm.core.streams import SHA256_HEX, StreamBook
from rlfarm.farm import keys


class Streams:
    def open_streams(self, count: int) -> None:
        if self.config.farm.episodes == "continue":
            self.streams = StreamBook(count)

    def stream_ref(self, index: int) -> dict[str, Any] | None:
        """What a rollout task on stream `index` carries; None in "fresh" mode."""
        return self.streams.ref(index) if self.streams is not None else None

    def advance_stream(self, message: Result, index: int) -> None:
        """The accepted result of a task on stream `index`: its next task continues from the snapshot
        this one saved; the one before is deleted from Redis (a copy still running of the task just
        accepted is skipped by its worker, so nothing will read it)."""
        if self.streams is None:
            return
        self._accepted_snapshots.pop(message.key, None)
        old, notice = self.streams.advance(message.stream, index)
        if notice:
            self.warn(f"run {self.config.run_id}: {notice}")
        if notice and message.stream.get("forged") and self.store.secret is not None:
            self.channel.stats.forged_snapshots += 1  # its digest came in a signed spec: a forgery
        if old is not None:
            self.client.delete(keys.stream(self.config.run_id, old))

    def late_copy(self, message: Result) -> None:
        """A straggler's copy, or an earlier trainer's, pushed its stream's snapshot with its result
        (rlfarm.worker.results), which counts for nothing: deleted, unless a stream stands at it or
        an accepted result names it (a copy continued from the same snapshot with the same seeds
        saves the very same bytes, under the same digest). Before, each stayed its 6 hours."""
        digest = (message.stream or {}).get("digest") if isinstance(message.stream, dict) else None
        if self.streams is None or not isinstance(digest, str) or not SHA256_HEX.fullmatch(digest):
            return
        if digest in self.streams.after or digest in self._accepted_snapshots.values():
            return
        self.client.delete(keys.stream(self.config.run_id, digest))
        self.streams.stats.late_dropped += 1

    def accepted_snapshot(self, message: Result) -> None:
        """An accepted result's snapshot, named until its stream advances to it (`advance_stream`)."""
        digest = (message.stream or {}).get("digest") if isinstance(message.stream, dict) else None
        if self.streams is not None and isinstance(digest, str):
            self._accepted_snapshots[message.key] = digest

    def drop_streams(self) -> None:
        """A finished run's snapshots (an interrupted one keeps them for --resume; they expire)."""
        if self.streams is not None:
            digests = {d for d in self.streams.after if d} | set(self._accepted_snapshots.values())
            names = [keys.stream(self.config.run_id, d) for d in sorted(digests)]
            if names:
                self.client.delete(*names)

"""Env streams: sub-envs whose episodes go on across tasks (`farm.episodes = "continue"`). PURE.

A run has a fixed set of streams, each with an index: SYNC one per task index (`farm.num_tasks`),
ASYNC one per task slot (`async.tasks_in_flight`). A task names the stream it continues and the
snapshot it continues from (`TaskSpec.stream`); its worker ends the task by saving the stream's
complete state (rlfarm.envs.snapshot: emulator or physics state, RNGs, frame stacks, the running
episode's return and length) as a content-addressed blob and reports its digest, which the trainer
names in the stream's next task. So a batch always holds `num_tasks x num_envs` distinct games, and
what a run learns does not depend on which process, or how many, ran its tasks: a process that still
holds the stream where the snapshot left it goes on at once; any other restores the snapshot first
(docs/architecture.md, decision 2).

Here: the streams' seeds, the snapshot blob (encode/decode, checked by its sha256), a worker
process's cache of streams, and the trainer's book of where each stream stands.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import zstandard

from rlfarm.core import codec
from rlfarm.errors import SnapshotError, SnapshotForged

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

# A snapshot decodes to at most this: Atari's 4 envs are ~0.3 MB raw, MuJoCo's a few KB; a blob that
# declares more is not one of ours.
MAX_SNAPSHOT_BYTES = 256 * 2**20
SHA256_HEX = re.compile(r"[0-9a-f]{64}")  # a snapshot's name (its digest), as a result reports it
ZSTD_LEVEL = 3


def stream_seeds(run_seed: int, index: int, restarts: int, num_envs: int) -> list[int]:
    """First-reset seeds of stream `index` of a run, after `restarts` restarts (a snapshot lost with
    Redis's data): the same for every process that starts it, distinct across streams, restarts and
    runs. Later episodes follow from each sub-env's own RNG, which the snapshots carry."""
    ss = np.random.SeedSequence([run_seed, 0x73747265616D, index, restarts])  # 0x73..: "stream"
    return [int(s) for s in ss.generate_state(num_envs, dtype=np.uint32)]


@dataclass
class EnvStream:
    """A stream's sub-envs in one worker process, and where its last task left them. `obs` is None
    until its first task resets the envs (with `first_seeds`); `digest` names the snapshot the stream
    is at (None until a task has run on it here)."""

    envs: VectorEnv
    first_seeds: list[int]
    obs: np.ndarray | None = None
    episode_return: np.ndarray = field(default_factory=lambda: np.zeros(0))
    episode_length: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    digest: str | None = None
    # A recurrent actor's state where the stream's last task left it (rlfarm.nn.acting.Actor), one row
    # per sub-env: the memory of the episodes still running, which the next task goes on from.
    policy_state: np.ndarray | None = None

    def close(self) -> None:
        self.envs.close()


# ---- snapshots -----------------------------------------------------------------------------------


def encode(stream: EnvStream, env_state: dict[str, Any]) -> tuple[bytes, str]:
    """A stream's snapshot blob and its digest (sha256, hex). `env_state`: rlfarm.envs.snapshot.capture
    of its envs. msgpack, then zstd over the whole (frame stacks and emulator states are mostly
    repeats)."""
    message = {
        "env": env_state,
        "obs": stream.obs,
        "episode_return": stream.episode_return,
        "episode_length": stream.episode_length,
    }
    if stream.policy_state is not None:  # (absent for feed-forward actors: their snapshots stay as they were)
        message["policy_state"] = stream.policy_state
    blob = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(codec.pack(message))
    return blob, hashlib.sha256(blob).hexdigest()


def decode(blob: bytes, digest: str) -> dict[str, Any]:
    """The snapshot `digest` names, from `blob` read back: its sha256 checked first (a blob someone
    else wrote under the key never reaches a decoder), then decompressed within MAX_SNAPSHOT_BYTES."""
    if hashlib.sha256(blob).hexdigest() != digest:
        raise SnapshotForged(f"snapshot {digest[:12]} does not match its digest (written by someone else?)")
    try:
        # A frame that declares its size is decompressed to that size whatever max_output_size says:
        # the declared size is checked first (a 169-byte blob declared 4 MB and got it).
        declared = zstandard.frame_content_size(blob)
        if declared > MAX_SNAPSHOT_BYTES:
            raise SnapshotError(
                f"snapshot {digest[:12]} declares {declared:,} bytes, above the "
                f"{MAX_SNAPSHOT_BYTES:,} a snapshot may hold"
            )
        raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=MAX_SNAPSHOT_BYTES)
    except zstandard.ZstdError as exc:
        raise SnapshotError(f"snapshot {digest[:12]} does not decompress: {exc}") from None
    try:  # its arrays within the same bound as the whole (codec's default is a result's 2 GiB)
        message = codec.unpack(raw, max_bytes=MAX_SNAPSHOT_BYTES)
    except (ValueError, RecursionError) as exc:
        raise SnapshotError(f"snapshot {digest[:12]} does not decode: {str(exc)[:200]}") from None
    if not isinstance(message, dict) or not isinstance(message.get("env"), dict) or message.get("obs") is None:
        raise SnapshotError(f"snapshot {digest[:12]} is not a stream's")
    return message


def resume(stream: EnvStream, message: dict[str, Any], restore_envs: Callable[[Any, dict], None]) -> None:
    """Put `stream` where the decoded snapshot `message` left its stream: envs (with `restore_envs`,
    rlfarm.envs.snapshot.restore), last observation, running episode returns and lengths."""
    restore_envs(stream.envs, message["env"])
    stream.obs = np.array(message["obs"])  # decoded arrays are read-only views of the blob
    stream.episode_return = np.array(message["episode_return"], np.float64)
    stream.episode_length = np.array(message["episode_length"], np.int64)
    state = message.get("policy_state")
    stream.policy_state = None if state is None else np.array(state, np.float32)


# ---- a worker process's streams ------------------------------------------------------------------


class StreamCache:
    """The streams a worker process holds, by (run, index), least recently used closed beyond `size`:
    a process serving many runs or many streams keeps bounded memory and env handles. A stream
    closed here is not lost: its next task restores it from its snapshot."""

    def __init__(self, size: int = 8):
        self.size = size
        self._streams: OrderedDict[tuple[str, int], EnvStream] = OrderedDict()

    def get(self, run: str, index: int) -> EnvStream | None:
        stream = self._streams.get((run, index))
        if stream is not None:
            self._streams.move_to_end((run, index))
        return stream

    def put(self, run: str, index: int, stream: EnvStream) -> None:
        old = self._streams.pop((run, index), None)
        if old is not None and old.envs is not stream.envs:
            old.close()
        self._streams[(run, index)] = stream
        while len(self._streams) > self.size:
            _, dropped = self._streams.popitem(last=False)
            dropped.close()

    def drop(self, run: str, index: int | None = None) -> None:
        """Forget one stream of a run (a task failed inside it: its state here is not trusted), or all
        of them (the run has a new trainer)."""
        for key in [k for k in self._streams if k[0] == run and index in (None, k[1])]:
            self._streams.pop(key).close()

    def __contains__(self, key: tuple[str, int]) -> bool:
        return key in self._streams

    def __len__(self) -> int:
        return len(self._streams)


# ---- the trainer's book --------------------------------------------------------------------------


@dataclass
class StreamStats:
    tasks: int = 0  # results that reported a stream
    moved: int = 0  # of those, tasks whose process restored the stream from its snapshot
    restarted: int = 0  # streams restarted from seeds: their snapshot was lost
    late_dropped: int = 0  # snapshots late copies of tasks left, which no task will read: deleted
    snapshot_bytes: int = 0  # over all results
    snapshot_seconds: float = 0.0  # workers' time saving and restoring snapshots, over all results


class StreamBook:
    """Where each of a run's streams stands: the snapshot its next task continues from (None: not
    started) and how often it was restarted. Advanced by the first accepted result of each task."""

    def __init__(self, count: int):
        self.after: list[str | None] = [None] * count
        self.restarts = [0] * count
        self.stats = StreamStats()

    def __len__(self) -> int:
        return len(self.after)

    def ref(self, index: int) -> dict[str, Any]:
        """What a task of stream `index` carries (TaskSpec.stream)."""
        return {"index": index, "after": self.after[index], "restarts": self.restarts[index]}

    def advance(self, report: dict[str, Any] | None, index: int) -> tuple[str | None, str | None]:
        """Take an accepted result's stream report (Result.stream) for the task sent on stream
        `index`. Returns the snapshot it supersedes (to delete) and, when the worker had to restart
        the stream, the one line that says so."""
        if not report or report.get("index") != index or not isinstance(report.get("digest"), str):
            raise ValueError(f"a result of stream {index} reported {report!r:.200} instead of its stream")
        old, self.after[index] = self.after[index], report["digest"]
        notice = None
        if int(report.get("restarts", 0)) > self.restarts[index]:
            self.restarts[index] = int(report["restarts"])
            self.stats.restarted += 1
            notice = (
                f"env stream {index} restarted from new seeds (restart {self.restarts[index]}): "
                f"{report.get('restart') or 'its snapshot was lost'}; its unfinished episodes are gone"
            )
        self.stats.tasks += 1
        self.stats.moved += bool(report.get("restored"))
        self.stats.snapshot_bytes += int(report.get("bytes", 0))
        self.stats.snapshot_seconds += float(report.get("seconds", 0.0))
        return (old if old != self.after[index] else None), notice

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "count": len(self),
            "tasks": s.tasks,
            "moved": s.moved,
            "restarted": s.restarted,
            "late_dropped": s.late_dropped,
            "snapshot_bytes_mean": round(s.snapshot_bytes / s.tasks) if s.tasks else 0,
            "snapshot_ms_mean": round(1000 * s.snapshot_seconds / s.tasks, 3) if s.tasks else 0.0,
        }

    def state(self) -> dict[str, Any]:
        """For the trainer's checkpoint: a resumed run goes on with the same streams."""
        return {"after": list(self.after), "restarts": list(self.restarts)}

    def restore(self, state: dict[str, Any] | None) -> None:
        """From a checkpoint; a run resumed with another number of streams (ASYNC on a farm of another
        size) keeps the first ones and starts the others."""
        if not state:
            return
        n = min(len(self), len(state.get("after", [])))
        self.after[:n] = state["after"][:n]
        self.restarts[:n] = state["restarts"][:n]

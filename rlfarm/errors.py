"""rlfarm's public errors, one base class: what a run, a command or the Python API can end with.

Each says in its message what went wrong and what to do; the CLI maps each class to its exit code in
one table (rlfarm.cli.common.EXIT_CODES). Errors private to one module (a retry's signal, a parse
step) stay in it.
"""

from __future__ import annotations

import re
from pathlib import Path


class RlfarmError(Exception):
    """Base of rlfarm's errors."""


# ---- Configuration and input -----------------------------------------------------------------
class ConfigError(RlfarmError, ValueError):
    """A preset, override or value that cannot make a valid run."""


class MissingPackage(ConfigError):
    """A setting that needs a package this machine has not installed (moviepy for --capture-video,
    MLflow for --track): the run cannot start here, though nothing typed was wrong (exit 1, not 2)."""


class RunExists(ConfigError):
    """A new run under a run id whose directory already holds a run."""

    def __init__(self, run_id: str, run_dir: Path):
        super().__init__(f"run {run_id} already exists in {run_dir.parent}/; choose another run_id")
        self.run_id, self.run_dir = run_id, run_dir


class VideoError(ConfigError):
    """--capture-video cannot record here: a missing package, an env that draws no frames."""


class VideoPackageMissing(VideoError, MissingPackage):
    """moviepy is not installed."""


class TrackingError(ConfigError):
    """--track cannot log: MLflow not installed, or its tracking store refuses."""


class TrackingPackageMissing(TrackingError, MissingPackage):
    """MLflow is not installed."""


class EnvError(RlfarmError, ValueError):
    """An env id that cannot be made, or spaces rlfarm cannot act in."""


class Unsnapshotable(EnvError):
    """An env whose state rlfarm cannot save and restore exactly."""


class PolicyFileError(RlfarmError, ValueError):
    """A file that is no policy, a forged or unreadable one, or one that does not fit the env given."""


class PolicyMismatch(RlfarmError, ValueError):
    """Saved tensors that do not fit the network an env's spaces call for (another env's policy)."""


class StateMismatch(RlfarmError, ValueError):
    """Saved tensors that are not the network an actor is built for (names or shapes)."""


class PlotError(RlfarmError, ValueError):
    """A run directory that cannot be plotted (missing, not a run, nothing logged yet)."""


class PlaybackError(RlfarmError, Exception):
    """What stops playback, as one line, with the exit status the CLI gives it."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class SweepError(RlfarmError, RuntimeError):
    """A sweep that cannot start, in one line."""


# ---- Redis and the farm ----------------------------------------------------------------------
class RedisAuthError(RlfarmError, ConnectionError):
    """Redis answered but refused the URL's credentials (or wanted some): a configuration error."""


class RedisEvicts(RlfarmError, RuntimeError):
    """Redis is set to drop keys under memory pressure: a run's metadata, policies and queued tasks
    would vanish mid-run (seen as a flush, then as missing policy versions)."""


class RedisUnavailable(RlfarmError, RuntimeError):
    """Redis stayed unreachable for longer than the outage limit."""


class RunInUse(RlfarmError, RuntimeError):
    """Another live trainer holds the run id (in this Redis) or the run directory."""


class NoRun(RlfarmError, LookupError):
    """RUN names no run directory (one with config.json)."""


class ClaimLost(RlfarmError, RuntimeError):
    """The trainer's claim expired (it was stopped longer than CLAIM_SECONDS) and another trainer
    took the run id meanwhile: this one must stop without touching the run."""


class ClusterError(RlfarmError, RuntimeError):
    """The embedded farm's redis-server or workers could not start."""


class LocalFarmError(RlfarmError, RuntimeError):
    """`rlfarm up` cannot start its farm (one is already up, a process failed)."""


class MetricsError(RlfarmError, Exception):
    """--metrics-port cannot be served: a bad value, prometheus_client missing, the port taken."""


# ---- What travels: tasks, results, policies, snapshots ---------------------------------------
class ProtocolError(RlfarmError, ValueError):
    """A task spec or result that does not have the fields it must have."""


class CodecError(RlfarmError, ValueError):
    """Bytes that do not decode to what they claim to be."""


class SignatureError(RlfarmError, ValueError):
    """Signed data that is unsigned, or whose signature does not verify."""


class PolicyError(RlfarmError, LookupError):
    """A policy version that cannot be handed out."""


class PolicyCorrupt(PolicyError):
    """A policy blob that fails its checks (hmac, sha256, version or run)."""


class RunNotFound(RlfarmError, LookupError):
    """A run id with no metadata in this Redis."""


class PolicyTrimmed(PolicyError):
    """A policy version older than those the run keeps (farm.keep_versions): trimmed."""


class PolicyNotFound(PolicyError):
    """A policy version that is not in Redis (never published, or deleted)."""


class SnapshotError(RlfarmError, ValueError):
    """A snapshot blob that is not the one its digest names, or does not decode."""


class SnapshotForged(SnapshotError):
    """A blob under a snapshot's key that is not the snapshot its digest names: written by someone
    else (with a secret the digest travels in signed specs, so this is a forgery: `security/*`)."""


class ResultTooLarge(RlfarmError, ValueError):
    """A result over the run's `farm.max_result_bytes`: refused before it is sent."""


class EnvFault(RlfarmError, RuntimeError):
    """Raised by an env (or a wrapper of it) for a fault of its machine, not of the task: a simulator
    that crashed, a license server gone. The task is sent again, to whichever worker takes it, counted
    towards farm.max_redispatch and, by `name`, in summary.json's `faults.reported`. `name`: a few
    lowercase letters, digits and underscores (`simulator_crash`), since it becomes a counter's name."""

    NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")

    def __init__(self, name: str, detail: str = ""):
        if not self.NAME.fullmatch(name):
            raise ValueError(f"EnvFault's name must match {self.NAME.pattern}, got {name!r}")
        super().__init__(f"{name}: {detail}" if detail else name)
        self.name = name


# ---- A run -----------------------------------------------------------------------------------
class RolloutError(RlfarmError, RuntimeError):
    """A task failed on its worker (bad env, missing policy version, ...): its message says why."""


class TaskLostError(RlfarmError, RuntimeError):
    """A task was re-sent max_redispatch times and still produced no result."""


class CheckpointError(RlfarmError, RuntimeError):
    """A trainer checkpoint that cannot be read or does not fit the run (`--resume`)."""


class RunDirError(RlfarmError, RuntimeError):
    """The trainer could not write a file of its run directory (disk full, read-only, ...)."""

    def __init__(self, path: Path | str, exc: OSError):
        self.path = Path(path)
        self.errno = exc.errno
        reason = exc.strerror or str(exc)
        super().__init__(f"cannot write {self.path}: {reason}" + (f" (errno {exc.errno})" if exc.errno else ""))

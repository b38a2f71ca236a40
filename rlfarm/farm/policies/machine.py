"""Policy versions shared by the worker processes of one machine: fetched from Redis once per machine,
not once per process.

Every pool process acts with every version, so without sharing a Pong policy (6.75 MB) costs Redis
6.75 MB x processes per version; with 16 processes on each of 10 machines that is most of what one
Redis can send (benchmarks/policy_fanout.py). Here the first process of the machine that needs a
version fetches it, under an exclusive lock on a file named after the version, and writes the blob
beside it; the others wait for the lock and read the file. A lock held by a process that dies is
released by the kernel with it (flock), so a SIGKILL never leaves a version locked.

What the file holds is only a copy of the bytes: every process checks what it reads (sha256, the
HMAC with RLFARM_SECRET, the version and run it claims) exactly as it checks a blob from Redis, and a
copy that fails is removed and fetched again. The directory is the user's own (0700), under /dev/shm
where it has room, else the temporary directory; `RLFARM_POLICY_SHARE=off` turns sharing off, and
`RLFARM_POLICY_SHARE=/path` puts it elsewhere. Each run keeps its newest `KEEP` versions there, other
incarnations of a run are removed as soon as a new one writes, runs (of any farm) untouched for
`STALE_SECONDS` go at the next write, and an embedded default's copies go with its Redis.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

POLICY_SHARE_VAR = "RLFARM_POLICY_SHARE"  # "off", a directory, or unset: the default place


def policy_share(environ: Mapping[str, str] = os.environ) -> str:
    """RLFARM_POLICY_SHARE, stripped: read by a worker's settings (rlfarm.worker.settings) and by the
    embedded cluster, which removes its workers' shared copies at its end."""
    return environ.get(POLICY_SHARE_VAR, "").strip()


KEEP = 4  # versions kept per run: a SYNC group acts with one, ASYNC tasks with the last few
STALE_SECONDS = 3600.0
SHM = Path("/dev/shm")
SHM_MIN_FREE = 512 << 20  # /dev/shm is 64 MiB in a default Docker container: the temp dir then


def _name(text: str) -> str:
    """A file name for a run id or incarnation (any string): readable prefix, unique hash."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:40]
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def default_root(redis_url: str, setting: str | None = None) -> Path | None:
    """Where this machine's workers of the farm at `redis_url` share versions (None: not shared), by
    `setting` (WorkerSettings.policy_share; None: RLFARM_POLICY_SHARE as it is now)."""
    if setting is None:
        setting = policy_share()
    if setting.lower() in ("off", "0", "no", "false"):
        return None
    if setting:
        base = Path(setting)
    else:
        try:
            roomy = SHM.is_dir() and shutil.disk_usage(SHM).free >= SHM_MIN_FREE
        except OSError:
            roomy = False
        base = SHM if roomy else Path(tempfile.gettempdir())
    # One directory per user and farm: versions of one run id on two farms are different versions.
    return base / f"rlfarm-policies-{os.getuid()}" / _name(redis_url)[-12:]


class SharedPolicies:
    """The machine's copies of policy blobs under `root`, one file per (run, incarnation, version)."""

    def __init__(self, root: Path, keep: int = KEEP):
        self.root, self.keep = Path(root), keep
        self._usable: bool | None = None

    def usable(self) -> bool:
        """Whether the directory is this user's own and closed to others (made so if absent); asked
        once per process. Otherwise nothing is read from it or written to it."""
        if self._usable is None:
            try:
                self.root.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                owner = self.root.parent.stat()
                self._usable = owner.st_uid == os.getuid() and not owner.st_mode & 0o077
            except OSError:
                self._usable = False
        return self._usable

    def path(self, run: str, incarnation: str, version: int, line: str | None = None) -> Path:
        """The file of a run version, or of a policy's own line version (`<policy>.<n>`)."""
        stem = str(version) if line is None else f"{line}.{version}"
        return self.root / _name(run) / _name(incarnation) / f"{stem}.safetensors"

    @contextmanager
    def locked(self, path: Path) -> Iterator[bool]:
        """Hold the lock of the version at `path`; yields whether it is held (False: no sharing here,
        e.g. the directory cannot be written; then every process fetches for itself)."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(path.with_suffix(".lock"), "a+b")
        except OSError:
            yield False
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or its process dies
            yield True

    @staticmethod
    def read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    def write(self, path: Path, blob: bytes, version: int, line: str | None = None) -> None:
        """Store the blob (whole: written beside, then renamed) and trim what is no longer needed. A
        full or read-only disk only means no sharing."""
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            return
        self._trim(path.parent, version, line)

    @staticmethod
    def drop(path: Path) -> None:
        path.unlink(missing_ok=True)

    def _trim(self, folder: Path, version: int, line: str | None = None) -> None:
        try:
            for old in folder.glob("*.safetensors"):
                whose, _, number = old.stem.rpartition(".")  # "" (the run's line) or a policy's name
                if whose == (line or "") and int(number) <= version - self.keep:
                    old.unlink(missing_ok=True)
                    (folder / f"{old.stem}.lock").unlink(missing_ok=True)
            for other in folder.parent.iterdir():  # earlier incarnations of this run id are over
                if other != folder:
                    shutil.rmtree(other, ignore_errors=True)
            self._forget_stale(keep=folder.parent)
        except (OSError, ValueError):
            pass

    def _forget_stale(self, keep: Path) -> None:
        """Runs of any farm of this user untouched for STALE_SECONDS, and farms left with none: a
        Redis that is gone (an embedded default's) leaves its runs' copies behind otherwise."""
        now = time.time()
        for farm in self.root.parent.iterdir():
            for run in farm.iterdir():
                # A version written into an incarnation's folder touches that folder, not the run's.
                touched = max((f.stat().st_mtime for f in run.iterdir()), default=run.stat().st_mtime)
                if run != keep and now - touched > STALE_SECONDS:
                    shutil.rmtree(run, ignore_errors=True)
            if farm != self.root and not any(farm.iterdir()):
                farm.rmdir()

    def remove(self) -> None:
        """Every copy of this farm's versions (its Redis is gone: the embedded default's, at its end)."""
        shutil.rmtree(self.root, ignore_errors=True)

"""One live trainer per run: a claim of the run id in Redis, a lock on the run directory.

`rlfarm:<run>:trainer` is the claim: JSON {incarnation, host, pid, since}, set only where there is
none (SET NX), with a short expiry (`CLAIM_SECONDS`) that a thread of the owning trainer renews
every fifth of it. Whoever does not get it touches nothing of the run and stops with `RunInUse`;
the owner deletes it at exit (only if it is still its own). A SIGKILLed trainer stops renewing, so
its claim expires by itself, and a trainer on the same host takes over at once a claim whose process
is gone (`rlfarm train --resume` right after a crash).

The claim is also what workers call a live trainer (docs/architecture.md, decision 4): a task carries
the incarnation (a nonce drawn per trainer start) of the trainer that sent it, and a worker runs it
only while the claim holds that incarnation. Tasks of a dead trainer, or of an earlier run under the
same id, are dropped unrun, and a worker that meets a new incarnation of a run forgets what it cached
of the old one (metadata, network, policies, env streams).

The run directory has its own lock (`RunDirLock`, flock on RUN_DIR/trainer.lock): two trainers with
one directory but different Redis servers (two embedded defaults) never write into each other.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from rlfarm.core import signing
from rlfarm.errors import ClaimLost, RunDirError, RunInUse
from rlfarm.farm import keys
from rlfarm.farm.keys import CLAIM_SECONDS  # noqa: F401 - part of this module's contract (tests, docs)


def claim_incarnation(raw: bytes | str | None) -> str | None:
    """The incarnation a claim's value names (None: no claim, or not one rlfarm wrote)."""
    holder = _parse(raw)
    value = holder.get("incarnation") if holder else None
    return value if isinstance(value, str) else None


def _parse(raw: bytes | str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


# Renew: extend our own claim; write it again if it vanished (expired while the trainer was stopped,
# a FLUSHALL, a Redis restarted without its data); 0 if another trainer holds it now.
_RENEW = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""
_REPLACE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # another user's live process
    try:  # a zombie (killed, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def describe_holder(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another trainer"
    since = holder.get("since")
    ago = f", for {max(0.0, time.time() - float(since)):.0f} s" if isinstance(since, (int, float)) else ""
    return f"another trainer (host {holder.get('host', '?')}, pid {holder.get('pid', '?')}{ago})"


class Claim:
    """A trainer's claim of its run id; `acquire` before anything of the run is touched."""

    def __init__(
        self,
        client: redis.Redis,
        run_id: str,
        seconds: float = CLAIM_SECONDS,
        secret: bytes | str | None = None,
        on_forged: Callable[[str], None] | None = None,
    ):
        """`secret`: signs the claim; with one, a claim that does not verify was written by someone
        without it and is refused and overwritten (`on_forged(text)` is told), never obeyed."""
        self.client = client
        self.run_id = run_id
        self.key = keys.claim(run_id)
        self.seconds = seconds
        self.secret = secret
        self.on_forged = on_forged or (lambda text: None)
        self.incarnation = secrets.token_hex(8)
        self.value = json.dumps(
            signing.sign_claim(
                run_id,
                {
                    "incarnation": self.incarnation,
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "since": round(time.time(), 3),
                },
                secret,
            )
        )
        self.held = False
        self.lost: str | None = None  # who took it, once another trainer did
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # renew() runs in the claim's thread, the watchdog's and the main loop's: one at a time. Two at
        # once could both see a forged claim, the first write ours back, and the second, its
        # compare-and-set then failing, take that for another trainer's claim and give the run up.
        self._renewing = threading.Lock()

    @property
    def _ms(self) -> int:
        return max(int(self.seconds * 1000), 100)

    def acquire(self) -> None:
        """Take the run id, or raise RunInUse naming its holder. A holder on this host whose process is
        gone (killed) is taken over at once; one elsewhere is free once its claim expires."""
        for _ in range(3):  # a claim expiring between SET NX and GET: try again
            if self.client.set(self.key, self.value, nx=True, px=self._ms):
                break
            raw = self.client.get(self.key)
            if raw is None:
                continue
            holder = _parse(raw) or {}
            if self._forged(holder, raw) and self.client.eval(_REPLACE, 1, self.key, raw, self.value, self._ms):
                break
            if self._stale(holder) and self.client.eval(_REPLACE, 1, self.key, raw, self.value, self._ms):
                break
            raise RunInUse(
                f"run {self.run_id!r} is in use by {describe_holder(holder)}: wait for it to end or stop it, "
                f"or choose another --run-id (a trainer that died frees its run {self.seconds:g} s later)"
            )
        else:
            raise RunInUse(f"run {self.run_id!r}: could not claim it in Redis")
        self.held = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="rlfarm-claim", daemon=True)
        self._thread.start()

    @staticmethod
    def _stale(holder: dict[str, Any]) -> bool:
        """A claim by a process of this host that is gone: a trainer that was killed. (The same pid as
        this process: the previous process of a restarted container, say.)"""
        pid = holder.get("pid")
        if holder.get("host") != socket.gethostname() or not isinstance(pid, int):
            return False
        return pid == os.getpid() or _process_gone(pid)

    def renew(self) -> bool:
        """Extend the claim (write it back if it vanished); False, and `lost` set, if another trainer
        holds it now."""
        with self._renewing:
            return self._renew()

    def _renew(self) -> bool:
        if self.lost is not None:
            return False
        if int(self.client.eval(_RENEW, 1, self.key, self.value, self._ms)):
            return True
        raw = self.client.get(self.key)
        holder = _parse(raw)
        if self._forged(holder or {}, raw) and int(self.client.eval(_REPLACE, 1, self.key, raw, self.value, self._ms)):
            return True
        if raw is None:  # expired between the two commands: ours to write again
            return self._renew()
        self.lost = describe_holder(holder)
        return False

    def _forged(self, holder: dict[str, Any], raw: bytes | str | None) -> bool:
        """With a secret, a claim that does not verify: written by someone without it (one SET must not
        end a signed run nor keep it from starting): said once per value, then overwritten."""
        if not self.secret or raw is None or signing.claim_signed(self.run_id, holder, self.secret):
            return False
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        self.on_forged(
            f"refused {self.key}: a claim of run {self.run_id!r} that is not signed by this "
            f"farm ({text[:80]!r}); wrote this trainer's back"
        )
        return True

    def _renew_loop(self) -> None:
        # A thread, not the training loop: a long SYNC update or checkpoint must not let it expire.
        while not self._stop.wait(self.seconds / 5):
            try:
                if not self.renew():
                    return
            except Exception:  # noqa: BLE001 - an outage: the trainer's own commands report it
                continue

    def check(self) -> None:
        """ClaimLost if another trainer took the run id (this one was stopped past the claim's expiry)."""
        if self.lost is not None:
            raise ClaimLost(
                f"run {self.run_id!r} was taken over by {self.lost} while this trainer was not "
                f"renewing its claim (stopped for more than {self.seconds:g} s?); this trainer "
                f"stops and leaves the run to it"
            )

    def release(self) -> None:
        """Stop renewing and delete the claim if it is still this trainer's: queued tasks of the run
        are dropped by workers from now on."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self.held and self.lost is None:
            try:
                self.client.eval(_RELEASE, 1, self.key, self.value)
            except Exception:  # noqa: BLE001 - Redis may be what failed; the claim expires by itself
                pass
        self.held = False


class RunDirLock:
    """flock on RUN_DIR/trainer.lock while a trainer writes the directory; the kernel drops it when the
    process dies, however it dies.

    A trainer that wrote nothing else there (refused: the run is claimed in Redis by another trainer)
    removes at release the lock file and the directories it made: a refusal leaves no trace. The file
    is unlinked while still locked, and a trainer that locks it checks that the path still names the
    file it locked, so no two trainers ever hold locks on two different files of one path."""

    NAME = "trainer.lock"

    def __init__(self, run_dir: Path | str):
        self.path = Path(run_dir) / self.NAME
        self._fd = -1
        self._made: list[Path] = []  # directories this lock created, deepest last
        self._created = False  # this lock created the file

    def acquire(self) -> None:
        self._made = [d for d in reversed(self.path.parents) if not d.exists()]
        for _ in range(10):  # the file unlinked by a refused trainer between our open and our flock
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _parse(os.pread(fd, 4096, 0))
                os.close(fd)
                self._forget_made()
                raise RunInUse(
                    f"run directory {self.path.parent} is in use by {describe_holder(holder)}: "
                    f"wait for it to end or stop it, or choose another --run-id or --logdir"
                ) from None
            if self._same_file(fd):
                break
            os.close(fd)
        else:
            raise RunDirError(self.path, OSError(f"{self.path} keeps being replaced"))
        try:  # who holds it, for the message of the next one to try
            os.ftruncate(fd, 0)
            os.pwrite(
                fd,
                json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": round(time.time(), 3)}).encode(),
                0,
            )
        except OSError:
            pass  # a full disk: the lock holds all the same
        self._fd = fd

    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                try:
                    fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                    self._created = True
                    return fd
                except FileExistsError:
                    pass
                try:
                    fd = os.open(self.path, os.O_RDWR)
                    self._created = False
                    return fd
                except FileNotFoundError:
                    continue  # unlinked between the two opens by a trainer that was refused
        except OSError as exc:
            raise RunDirError(self.path, exc) from None

    def _same_file(self, fd: int) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _forget_made(self) -> None:
        """Remove the directories acquire made, where still empty (deepest first)."""
        for directory in reversed(self._made):
            try:
                directory.rmdir()
            except OSError:
                break  # not empty (someone wrote there meanwhile) or not ours to remove
        self._made = []

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            untouched = self._created and [p.name for p in self.path.parent.iterdir()] == [self.NAME]
        except OSError:
            untouched = False
        if untouched:  # nothing but the lock: this trainer wrote nothing (refused before it began)
            try:
                self.path.unlink()  # while locked: see the class docstring
            except OSError:
                untouched = False
        os.close(self._fd)
        self._fd = -1
        if untouched:
            self._forget_made()

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

"""A Celery worker forked from the calling process instead of started from a fresh interpreter
(docs/architecture.md, decision 28): with torch already imported there (the embedded default's
trainer), its start costs a few tenths of a second of CPU instead of seconds
(`python benchmarks/startup.py`). rlfarm.local.cluster starts the embedded worker so.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


def death_signal() -> None:
    """SIGTERM to this process when its parent dies (PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class ForkedWorker:
    """A Celery worker forked from this process. It answers the parts of subprocess.Popen the cluster
    uses (pid, poll, wait, returncode).

    Only from a process with one thread (`can_fork`): a lock another thread held at the fork would
    stay locked in the child for good. The child behaves as if exec'd: its own session, the death
    signal, default signal handlers, stdin from /dev/null, stdout and stderr to its log, no other
    file descriptor of ours (the run directory's flock above all), `ps` showing its command line."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path, detached: bool):
        """`command`: `python -m celery ARGS...`, as it would be exec'd (and as `ps` shows it)."""
        self.args = command
        self.returncode: int | None = None
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # else the child writes our buffered output again
            stream.flush()
        pid = os.fork()
        if pid == 0:
            _become_worker(command, env, log_path, None if detached else parent)
        self.pid = pid

    @staticmethod
    def can_fork() -> bool:
        try:
            import setproctitle  # noqa: F401  (else `ps` would show the worker as this command)
        except ImportError:
            return False
        # Linux only: elsewhere a fork after some system frameworks were loaded (macOS) can crash. Not
        # after CUDA was initialised here (`rlfarm.train()` in a program that uses the GPU): a forked
        # child cannot use the parent's CUDA context, and nothing should make it try.
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return False
        return sys.platform.startswith("linux") and threading.active_count() == 1

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: it has exited, its code is unknown
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)  # polling its exit (as Popen.wait with a timeout does)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _become_worker(command: list[str], env: dict[str, str], log_path: Path, parent: int | None) -> None:
    """In the forked child: become `python -m celery ARGS...` and exit with its code; never returns."""
    code = 1
    try:
        # Objects inherited from the parent are never collected here by the cyclic collector; one
        # finalized anyway (its last reference dropped, in this process or a pool process forked from
        # it) closes the descriptor it owned, which is why those are not closed below but replaced.
        gc.freeze()
        os.setsid()
        if parent is not None:
            death_signal()
            if os.getppid() != parent:  # it died before the death signal was set
                os._exit(1)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # Every other inherited descriptor (the run directory's flock, the parent's pipes and sockets)
        # becomes /dev/null rather than closed: its number stays taken, so none of the worker's own
        # (its pool's pipes) gets it, and an inherited object that closes "its" descriptor later
        # closes only that /dev/null (closed, the number was reused and a pool process's pipe closed
        # under it: tests/test_forked.py). Linux only (can_fork).
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2 and fd != null:
                os.dup2(null, fd)
        from setproctitle import setproctitle

        setproctitle(" ".join(command))
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["celery", *command[command.index("celery") + 1 :]]
        from celery.__main__ import main as celery_main

        celery_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)

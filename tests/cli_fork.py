"""`rlfarm` commands for the tests, each a real process forked from one that imported rlfarm, torch,
Celery and gymnasium once (multiprocessing's forkserver): the suite runs a few hundred commands, and
each fresh interpreter spent about 3 CPU-s importing them, a fifth of the suite's CPU on 2 cores.

The forked process is the command as `python cli.py ARGS` runs it: its own pid, environment, working
directory and output files, `cli.py` run as `__main__`, the interpreter's exit status (SystemExit and
uncaught exceptions alike) and its exit handlers. The forkserver has only imported modules when it
forks: it is single-threaded and has run no torch op, so nothing a thread or a thread pool held
reaches the child. `run` runs a command to completion; `Command` is one running, signalled by its pid
and reaped through the forkserver. Tests that read a command's output as it runs, or start workers,
run `rlfarm_cmd` in a fresh interpreter (subprocess.Popen)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "cli.py"

_context = None
STDOUT = "<stdout>"


def _forkserver():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["tests.cli_preload"])
    return _context


def _command(
    args: list[str], env: dict[str, str], cwd: str | None, out: str, err: str, nice: int, new_session: bool = False
) -> None:
    """The forked process: `python cli.py ARGS` from here on, then the interpreter's exit. `out` and
    `err` are files to append to; `err` may be STDOUT (subprocess.STDOUT's meaning)."""
    import atexit
    import runpy
    import sys
    import traceback

    if new_session:
        os.setsid()
    for fd, path in ((1, out), (2, err)):
        if path == STDOUT:
            os.dup2(1, 2)
            continue
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)  # as a subprocess of the (lowered) test process
    sys.argv = [str(CLI), *args]
    import setproctitle

    setproctitle.setproctitle(" ".join([sys.executable, *sys.argv]))  # `ps` shows the command, not the forkserver
    # As the interpreter starts: the script's folder, then PYTHONPATH's entries (a test may put a
    # stub module first there), then the rest.
    sys.path[0:0] = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    code = 0
    try:
        runpy.run_path(str(CLI), run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def run(args: list[str], env: dict[str, str], cwd=None, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` to completion, output captured as text: subprocess.run's result."""
    command = Command(args, env, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = command.communicate(timeout)
    except subprocess.TimeoutExpired:
        command.kill()
        command.wait()
        out, err = command.communicate()
        raise subprocess.TimeoutExpired(command.args, timeout, out, err) from None
    return subprocess.CompletedProcess(command.args, command.returncode, out, err)


class Command:
    """A forked `rlfarm` command while it runs: what the tests use of subprocess.Popen. Its output
    goes to files, so `stdout`/`stderr` (PIPE) are read whole once it has exited (communicate)."""

    def __init__(self, args, env, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
        self.args = [str(CLI), *args]
        self._tmp = tempfile.TemporaryDirectory(prefix="rlfarm-cmd-")
        self._text = text
        self._pipes: dict[str, str] = {}
        paths = []
        for name, target in (("stdout", stdout), ("stderr", stderr)):
            if target is subprocess.PIPE:
                path = self._pipes[name] = os.path.join(self._tmp.name, name)
                Path(path).touch()
            elif target is subprocess.STDOUT and name == "stderr":
                path = STDOUT
            elif target is None or target is subprocess.DEVNULL:
                path = os.devnull
            else:  # an open file: the child appends to it by name
                path = target.name
            paths.append(path)
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        self._process = _forkserver().Process(
            target=_command,
            args=(
                [str(a) for a in args],
                dict(env),
                None if cwd is None else str(cwd),
                *paths,
                nice,
                start_new_session,
            ),
        )
        self._process.start()
        self.pid = self._process.pid
        self.returncode = None

    def poll(self):
        if self.returncode is None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _read(self, name):
        if name not in self._pipes:
            return None
        data = Path(self._pipes[name]).read_bytes()
        return data.decode("utf-8", errors="replace") if self._text else data

    def communicate(self, timeout=None):
        self.wait(timeout)
        return self._read("stdout"), self._read("stderr")

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.poll() is None:
            self.wait()

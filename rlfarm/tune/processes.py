"""Trainer subprocesses: `rlfarm train ...` started for a seed or a trial, watched, and stopped.

A trainer in its own process isolates faults: one that fails (or is killed) is one failed seed or
trial, the others go on. Each child runs in a session of its own (a Ctrl-C at the terminal reaches the
parent, which stops them) and gets SIGTERM if the parent dies (PR_SET_PDEATHSIG: children are started
from the main thread only, since the signal follows the thread that forked). SIGTERM makes a trainer
stop cleanly (its tasks and claim released, exit 130); after `grace` seconds it is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlfarm.local.cluster import die_with_parent

GRACE = 15.0  # seconds a stopped trainer gets to clean up before SIGKILL


def train_command(args: list[str]) -> list[str]:
    """argv of `rlfarm train ARGS` with this interpreter and this rlfarm (rlfarm.cli)."""
    return [sys.executable, "-m", "rlfarm.cli", "train", *args]


class TrainerProcess:
    """One `rlfarm train` child, its output in `log` (stdout and stderr together)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]):
        self.log = Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.stop_sent: float | None = None
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                train_command(args),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                preexec_fn=die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> int | None:
        return self.proc.poll()

    def stop(self) -> None:
        """Ask it to stop (SIGTERM); `reap` SIGKILLs it once the grace has passed."""
        if self.stop_sent is None and self.proc.poll() is None:
            self.stop_sent = time.monotonic()
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reap(self, grace: float = GRACE) -> bool:
        """True once it has exited (SIGKILL after `grace` seconds of a stop)."""
        if self.proc.poll() is not None:
            return True
        if self.stop_sent is not None and time.monotonic() - self.stop_sent > grace:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            return True
        return False

    def failure(self) -> str:
        """Why it failed, in one line: its last `rlfarm: error:` line, else how it exited."""
        code = self.proc.returncode
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        errors = [line.split("rlfarm: error: ", 1)[1] for line in lines if "rlfarm: error: " in line]
        if errors:
            return errors[-1]
        if code is not None and code < 0:
            return f"trainer killed by {signal.Signals(-code).name}"
        tail = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return f"trainer exited with status {code}" + (f": {tail[-200:]}" if tail else "")


def stop_all(trainers: list[TrainerProcess], grace: float = GRACE) -> None:
    """SIGTERM to every live one, then wait (SIGKILL after `grace`): none is left running."""
    for trainer in trainers:
        trainer.stop()
    while not all(trainer.reap(grace) for trainer in trainers):
        time.sleep(0.1)  # polling interval while they clean up

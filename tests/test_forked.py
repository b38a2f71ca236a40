"""When the embedded worker may be forked from its trainer (rlfarm.local.forked), without forking.
The forked worker itself is exercised by every embedded run of the suite; the Ctrl-C test of
tests/test_cli.py checks it against one started from a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from rlfarm.local.forked import ForkedWorker
from tests.conftest import ROOT, WORKER_ENV


def test_one_thread_on_linux_forks(monkeypatch):
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert ForkedWorker.can_fork()


def test_another_thread_cuda_or_another_system_does_not(monkeypatch):
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(threading, "active_count", lambda: 2)  # a lock it holds would stay held
    assert not ForkedWorker.can_fork()
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not ForkedWorker.can_fork()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr("sys.platform", "darwin")
    assert not ForkedWorker.can_fork()


# Run in a fresh interpreter: a pytest process may hold threads (then it would not fork) and keeps
# every at-fork hook it is given.
_CLOSE_INHERITED = """
import os, subprocess, sys
from pathlib import Path
from rlfarm.local.cluster import LocalCluster
from rlfarm.local.forked import ForkedWorker

logdir, env = Path(sys.argv[1]), {**os.environ}
assert ForkedWorker.can_fork(), "this process cannot fork"
parent = os.getpid()
held = [open(logdir / f"held-{i}", "w") for i in range(32)]  # a trainer's files and sockets: low numbers
inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]


def close_inherited_in_pool_processes():
    if os.getppid() != parent:  # a pool process: forked from the forked worker
        for fd in inherited:
            try:
                os.close(fd)
            except OSError:
                pass


os.register_at_fork(after_in_child=close_inherited_in_pool_processes)
with LocalCluster(workers=1, name="rlfarm-test-inherited", log_dir=logdir, fork_workers=True) as cluster:
    assert isinstance(cluster.worker_procs[0], ForkedWorker)
    command = [sys.executable, sys.argv[2], "train", "--redis", cluster.redis_url, "--preset", "cartpole-ppo",
               "--total-steps", "2048", "--run-id", "inherited", "--logdir", str(logdir)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Bad file descriptor" not in (logdir / "worker-0.log").read_text()
print("trained")
"""


@pytest.mark.farm
def test_descriptors_the_parent_owned_closed_in_a_pool_process_break_nothing(tmp_path):
    """An object inherited from the trainer and finalized in a pool process of its forked worker (its
    last reference dropped there) closes the descriptor number it owned. Here every number the parent
    had open is closed so in each pool process: the forked worker keeps those numbers on /dev/null,
    so none is one of the pool's pipes, and a run trains to its end (with them closed and reused, each
    pool process died at its first write and the run waited for ever)."""
    result = subprocess.run(
        [sys.executable, "-c", _CLOSE_INHERITED, str(tmp_path), str(ROOT / "cli.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **WORKER_ENV},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("trained")

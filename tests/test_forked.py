"""When the embedded worker may be forked from its trainer (rlfarm.local.forked), without forking.
The forked worker itself is exercised by every embedded run of the suite; the Ctrl-C test of
tests/test_cli.py checks it against one started from a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
import torch

from rlfarm.local.cluster import LocalCluster
from rlfarm.local.forked import ForkedWorker
from tests.conftest import WORKER_ENV, rlfarm_cmd


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


@pytest.mark.farm
def test_descriptors_the_parent_owned_closed_in_a_pool_process_break_nothing(tmp_path):
    """An object inherited from the trainer and finalized in a pool process of its forked worker (its
    last reference dropped there) closes the descriptor number it owned. Here every number the parent
    had open is closed so in each pool process: the forked worker keeps those numbers on /dev/null,
    so none is one of the pool's pipes, and a run trains to its end (with them closed and reused, each
    pool process died at its first write and the run waited for ever)."""
    if not ForkedWorker.can_fork():
        pytest.skip("this test process cannot fork a worker (more than one thread, or not Linux)")
    parent = os.getpid()
    inherited = [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
    armed = [True]

    def close_inherited_in_pool_processes() -> None:
        if armed and os.getppid() != parent:  # a pool process: forked from the forked worker
            for fd in inherited:
                try:
                    os.close(fd)
                except OSError:
                    pass

    os.register_at_fork(after_in_child=close_inherited_in_pool_processes)
    try:
        with LocalCluster(
            workers=1, name="rlfarm-test-inherited", log_dir=tmp_path, extra_env=WORKER_ENV, fork_workers=True
        ) as cluster:
            assert isinstance(cluster.worker_procs[0], ForkedWorker)
            command = rlfarm_cmd(
                "train", "--redis", cluster.redis_url, "--preset", "cartpole-ppo", "--total-steps", "2048",
                "--run-id", "inherited", "--logdir", str(tmp_path),
            )  # fmt: skip
            result = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, **WORKER_ENV}, timeout=300
            )
            assert result.returncode == 0, result.stderr[-2000:]
            assert "Bad file descriptor" not in (tmp_path / "worker-0.log").read_text()
    finally:
        armed.clear()

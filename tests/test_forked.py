"""When the embedded worker may be forked from its trainer (rlfarm.local.forked), without forking.
The forked worker itself is exercised by every embedded run of the suite; the Ctrl-C test of
tests/test_cli.py checks it against one started from a fresh interpreter."""

from __future__ import annotations

import threading

import torch

from rlfarm.local.forked import ForkedWorker


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

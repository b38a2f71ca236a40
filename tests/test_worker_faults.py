"""Faults of the workers themselves, done for real: a worker of another rlfarm version, a worker
stopped by SIGTERM (a spot instance's notice) mid-task, an env that hangs.

Each test starts its own redis-server and real workers on 127.0.0.1 (rlfarm.cluster.LocalCluster,
stopped by pid) and drives the real `rlfarm train` command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlfarm.cluster import LocalCluster
from rlfarm.protocol import PROTOCOL

from .conftest import ROOT, WORKER_ENV, one_error_line, poll, read_summary, rlfarm_cmd, run_cli

pytestmark = pytest.mark.farm

RLFARM_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "WARNING"]
SLOW_PPO = ["--preset", "cartpole-ppo", "--env", "tests.tiny_envs:slow", "--set", "env.num_envs=1",
            "--set", "farm.num_tasks=2", "--set", "farm.steps_per_env=250", "--set", "ppo.num_minibatches=2",
            "--set", "policy.hidden_sizes=[16]"]


def cluster(tmp_path: Path, name: str, **env: str) -> LocalCluster:
    c = LocalCluster(workers=0, name=f"rlfarm-{name}-{os.getpid()}", log_dir=tmp_path,
                     extra_env={**WORKER_ENV, "RLFARM_REDIS_OUTAGE_TIMEOUT": "300", **env})
    c.start()
    return c


def train(c: LocalCluster, tmp_path: Path, run_id: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(rlfarm_cmd("train", "--redis", c.redis_url, "--run-id", run_id,
                                       "--logdir", str(tmp_path), *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **WORKER_ENV})


def worker_log(c: LocalCluster, proc: subprocess.Popen) -> str:
    return (c.log_dir / f"worker-{c.worker_procs.index(proc)}.log").read_text(errors="replace")


# ---- item 9: a worker of another version ---------------------------------------------------------
def test_a_worker_of_another_protocol_refuses_in_one_line_and_the_run_goes_on_with_the_others(tmp_path):
    """One `rlfarm worker` of this version and one that speaks protocol PROTOCOL + 6, as a worker of
    another rlfarm does: the other one refuses every task it takes, unrun, in one line naming both
    versions; the trainer warns once naming it, sends its tasks to the other worker and finishes;
    `rlfarm status` shows each worker's version."""
    other = PROTOCOL + 6
    c = cluster(tmp_path, "protocol")
    try:
        c.add_worker(1, command=RLFARM_WORKER)
        old = c.add_worker(1, command=[sys.executable, "-m", "tests.worker_of_protocol", str(other),
                                       "worker", "-l", "WARNING"])
        old_node = c._nodes[1]
        status = run_cli("status", "--json", "--redis", c.redis_url)
        assert status.returncode == 0, status.stderr
        versions = {w["name"]: w["protocol"] for w in json.loads(status.stdout)["workers"]}
        assert versions == {c._nodes[0]: PROTOCOL, old_node: other}
        table = run_cli("status", "--redis", c.redis_url, env={"COLUMNS": "200"}).stdout
        assert f"protocol {other}" in table and f"protocol {PROTOCOL}" in table

        proc = train(c, tmp_path, "protocol", *SLOW_PPO, "--total-steps", "2000")
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        s = read_summary(tmp_path / "protocol")
        assert s["env_steps"] >= 2000 and s["faults"]["refused"] >= 1
        warnings = [line for line in stderr.splitlines() if "refuses this run's tasks" in line]
        assert len(warnings) == 1, stderr[-3000:]  # once, however many tasks it refused
        assert warnings[0].startswith("rlfarm: warning: worker ") and old_node in warnings[0]
        assert f"protocol {other}, this trainer {PROTOCOL}" in warnings[0]
        assert "Traceback" not in stderr
        # The old worker's own line names both versions; it never ran a task of this run.
        refusals = [line for line in worker_log(c, old).splitlines() if "ProtocolMismatch" in line]
        assert refusals and all(f"speaks rlfarm protocol {other}, the task protocol {PROTOCOL}" in line
                                for line in refusals)
        assert len(refusals) >= s["faults"]["refused"]  # a refusal of a superseded copy is not counted
        ids = s["accepted_task_ids"]
        assert len(ids) == len(set(ids)) and s["env_steps"] == len(ids) * 250
    finally:
        c.stop()

"""`rlfarm up` / `rlfarm down`: a local farm that outlives the command and serves repeated runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest

from .conftest import WORKER_ENV, pid_alive, rlfarm_cmd

pytestmark = pytest.mark.farm

SMALL = ["--total-steps", "2048", "--set", "farm.num_tasks=2", "--set", "env.num_envs=1",
         "--set", "farm.steps_per_env=512", "--set", "ppo.num_minibatches=2"]


def test_up_then_train_on_it_then_down(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, **WORKER_ENV, "RLFARM_HOME": str(home)}

    def cli(*args):
        return subprocess.run(rlfarm_cmd(*args), env=env, capture_output=True, text=True, timeout=600)

    up = cli("up", "-w", "1")
    assert up.returncode == 0, up.stderr
    state_file = home / "local-farm.json"
    state = json.loads(state_file.read_text())
    try:
        assert "local farm up" in up.stdout and ":***@127.0.0.1" in up.stdout
        assert state["redis_url"].split("@")[0] not in up.stdout  # the password is not printed
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600  # it holds the password
        assert all(pid_alive(pid) for pid in state["pids"])  # outlived `rlfarm up`
        again = cli("up")
        assert again.returncode == 1 and "already up" in again.stderr
        for run_id in ("first", "second"):
            train = cli("train", "--logdir", str(tmp_path), "--run-id", run_id, *SMALL)
            assert train.returncode == 0, train.stderr[-3000:]
            assert "training on the local farm started by `rlfarm up`" in train.stderr
            assert not (tmp_path / run_id / "cluster.json").exists()  # nothing embedded was started
            assert json.loads((tmp_path / run_id / "summary.json").read_text())["env_steps"] == 2048
        assert all(pid_alive(pid) for pid in state["pids"])  # still up after both runs
        # Signed by default: `up` made a secret (kept in the 0600 state file), its workers and the
        # runs trained on it use it, so the run's metadata in Redis carries an hmac.
        assert len(state["secret"]) == 64
        import redis

        meta = redis.Redis.from_url(state["redis_url"]).get("rlfarm:first:meta")
        assert set(json.loads(meta)) == {"signed", "hmac"}
    finally:
        down = cli("down")
    assert down.returncode == 0 and "local farm stopped (2 processes)" in down.stdout
    assert not [pid for pid in state["pids"] if pid_alive(pid)]
    assert not state_file.exists()
    assert "no local farm was up" in cli("down").stdout

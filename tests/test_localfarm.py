"""`rlfarm up` / `rlfarm down`: a local farm that outlives the command and serves repeated runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess

import pytest
import redis

from rlfarm.farm.shares import live_nodes

from .conftest import WORKER_ENV, error_line, pid_alive, poll, rlfarm_cmd, run_command

pytestmark = pytest.mark.farm

SMALL = [
    "--total-steps",
    "2048",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=512",
    "--set",
    "ppo.num_minibatches=2",
]


def test_up_then_train_on_it_then_down(tmp_path):
    """Every command finds the up farm by itself, with its secret (issue 33): status names it, a worker
    started without --redis joins it, `rlfarm train` trains on it with or without its URL exported,
    checkpoints and eval --run read its runs; after `down`, a command that needs a farm says what it tried."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("RLFARM_REDIS_URL", "RLFARM_SECRET")}
    env = {**env, **WORKER_ENV, "RLFARM_HOME": str(home)}

    def cli(*args, extra=None):
        return run_command(*args, env={**env, **(extra or {})}, timeout=600)

    up = cli("up", "-w", "1")
    assert up.returncode == 0, up.stderr
    state_file = home / "local-farm.json"
    state = json.loads(state_file.read_text())
    redacted = "redis://:***@" + state["redis_url"].split("@")[1]
    joiner = None
    try:
        assert "local farm up" in up.stdout and ":***@127.0.0.1" in up.stdout
        assert ", 1 worker process, logs in" in up.stdout  # not "1 worker processes" (issue 51's walk)
        # how to add workers here, and where its URL and secret are kept (for Flower)
        assert "`rlfarm worker -c N`" in up.stdout and str(state_file) in up.stdout
        assert "other machines: this farm listens on 127.0.0.1 only" in up.stdout  # said, not promised
        # Flower, the dashboard, behind the password `up` prints (issue 51: started by hand before)
        dash = state["flower"]
        assert f"Flower: {dash['url']} (user rlfarm, password {dash['password']})" in up.stdout
        poll(lambda: _http_status(dash["url"] + "/workers") == 401, "Flower answering, behind its password")
        assert _http_status(dash["url"] + "/workers", ("rlfarm", dash["password"])) == 200
        assert state["redis_url"].split("@")[0] not in up.stdout  # the password is not printed
        assert state["secret"] not in up.stdout
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600  # it holds the password
        assert all(pid_alive(pid) for pid in state["pids"])  # outlived `rlfarm up`
        again = cli("up")
        assert again.returncode == 1 and "already up" in again.stderr

        status = cli("status")  # found with no --redis and no RLFARM_REDIS_URL, and named
        assert status.returncode == 0, status.stderr
        assert status.stdout.splitlines()[0] == f"farm: the rlfarm up farm, {redacted}"

        # A worker started without --redis joins the up farm, with its secret.
        log = tmp_path / "joiner.log"
        with open(log, "wb") as out:
            joiner = subprocess.Popen(
                rlfarm_cmd("worker", "-c", "1", "-n", "joiner@%h"),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        client = redis.Redis.from_url(state["redis_url"])
        poll(
            lambda: any(n.startswith("joiner@") for n in live_nodes(client)),
            "the joining worker registered",
            joiner,
            log,
        )

        # 4 tasks an iteration, 2 iterations, for 2 single-process workers: the joiner takes some of them
        small = [*SMALL, "--set", "farm.num_tasks=4", "--total-steps", "4096"]
        first = cli("train", "--logdir", str(tmp_path), "--run-id", "first", *small)
        # its URL exported (for Flower, say) and no RLFARM_SECRET: the up farm's secret comes with it
        second = cli(
            "train",
            "--logdir",
            str(tmp_path),
            "--run-id",
            "second",
            *small,
            extra={"RLFARM_REDIS_URL": state["redis_url"]},
        )
        for run_id, train in (("first", first), ("second", second)):
            assert train.returncode == 0, train.stderr[-3000:]
            assert "not signed" not in train.stderr and "refused" not in train.stderr, train.stderr[-3000:]
            assert not (tmp_path / run_id / "cluster.json").exists()  # nothing embedded was started
            assert json.loads((tmp_path / run_id / "summary.json").read_text())["env_steps"] == 4096
        assert "training on the local farm started by `rlfarm up`" in first.stderr
        assert "farm: RLFARM_REDIS_URL (the rlfarm up farm)" in second.stderr
        assert all(pid_alive(pid) for pid in state["pids"])  # still up after both runs

        snap = json.loads(cli("status", "--json").stdout)
        assert snap["farm"]["source"] == "the rlfarm up farm" and snap["redis"] == redacted
        [node] = [w for w in snap["workers"] if w["name"].startswith("joiner@")]
        assert node["tasks_done"] > 0  # it ran tasks of both runs...
        text = log.read_text(errors="replace")
        assert "farm: the rlfarm up farm" in text
        assert "not signed" not in text and "bad signature" not in text, text[-3000:]  # ...with the secret
        assert "superuser privileges" not in text  # Celery's six lines as root: one line of ours instead
        assert ("running as root: Celery allows it" in text) == (os.geteuid() == 0)
        assert {r["run_id"]: r["heartbeat"]["state"] for r in snap["runs"]} == {
            "first": "finished",
            "second": "finished",
        }

        listed = cli("checkpoints", "list")
        assert listed.returncode == 0 and "first" in listed.stdout and "second" in listed.stdout, listed.stderr
        played = cli("eval", "--run", "second", "--episodes", "2")  # signed versions, checked with its secret
        assert played.returncode == 0 and "over 2 greedy episodes" in played.stdout, played.stderr

        # Signed by default: `up` made a secret (kept in the 0600 state file), its workers and the
        # runs trained on it use it, so the run's metadata in Redis carries an hmac.
        assert len(state["secret"]) == 64
        meta = client.get("rlfarm:first:meta")
        assert set(json.loads(meta)) == {"signed", "hmac"}
    finally:
        down = cli("down")  # the joined worker still runs: `down` tells it to stop (issue 51: it
        # retried the farm's gone Redis for good)
        if joiner is not None:
            try:
                joiner.wait(timeout=60)
            except subprocess.TimeoutExpired:
                joiner.terminate()
                joiner.wait()
    assert down.returncode == 0 and "local farm stopped (3 processes)" in down.stdout  # Redis, worker, Flower
    assert not pid_alive(state["flower"]["pid"])
    assert "told the workers that joined it to stop: joiner@" in down.stdout, down.stdout
    assert joiner.returncode == 0, log.read_text(errors="replace")[-3000:]  # it stopped by itself, cleanly
    assert not [pid for pid in state["pids"] if pid_alive(pid)]
    assert not state_file.exists()
    assert "no local farm was up" in cli("down").stdout
    for command in (["status"], ["worker"], ["checkpoints", "list"], ["eval", "--run", "first"]):
        none = cli(*command)
        assert none.returncode == 1, (command, none.stderr)
        assert "no farm found: no --redis, no RLFARM_REDIS_URL, no `rlfarm up` farm" in error_line(none), command


def _http_status(url: str, auth: tuple[str, str] | None = None) -> int | None:
    """The HTTP status `url` answers with (None: nothing answers yet)."""
    import base64
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None

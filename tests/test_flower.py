"""Flower on a real farm: readable task names and arguments, a failed task FAILURE, and its API closed
without credentials."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from rlfarm.farm.app import EVAL_TASK, ROLLOUT_TASK, make_app
from rlfarm.farm.connection import connect
from rlfarm.local.cluster import LOOPBACK, LocalCluster, free_port, stop_process_group
from rlfarm.trainer.channel import FarmLink

from .conftest import ROOT, WORKER_ENV, http_request, make_run, poll

pytestmark = pytest.mark.farm

DEADLINE = 120.0  # generous: Flower, workers and events all start on a loaded 2-core machine


def _request(url: str, auth: str | None, method: str = "GET") -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(http_request(url, auth, method), timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""  # not listening yet


@pytest.fixture
def events_farm(tmp_path):
    with LocalCluster(
        workers=2, name="rlfarm-test-flower", log_dir=tmp_path, extra_env=WORKER_ENV, events=True
    ) as cluster:
        yield cluster


def test_flower_shows_rollouts_and_evaluations_and_refuses_anonymous_control(events_farm, tmp_path):
    farm = events_farm
    auth = f"rlfarm:{secrets.token_urlsafe(12)}"
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    env = {**os.environ, **WORKER_ENV, "RLFARM_REDIS_URL": farm.redis_url, "FLOWER_BASIC_AUTH": auth}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    log = open(tmp_path / "flower.log", "wb")
    # Flower's own options are tornado options: --name=value, one word each.
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", f"--address={LOOPBACK}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Flower's event stream is live once a worker heartbeat (sent with -E) reached it.
        def live_workers():
            status, body = _request(f"{base}/workers?json=1", auth)
            return status == 200 and [w["hostname"] for w in json.loads(body)["data"] if w.get("status")]

        poll(live_workers, "worker heartbeats in flower", flower, tmp_path / "flower.log", DEADLINE)

        make_run(farm.redis_url, "flower")
        d = FarmLink(make_app(farm.redis_url), connect(farm.redis_url), "flower", 60.0, 3, env="CartPole-v1").open()
        d.gather_group([{"iteration": 0, "index": i, "version": 0, "steps": 32, "seed": 5} for i in range(3)])
        for i in range(2):
            d.submit({"kind": "eval", "iteration": 0, "index": i, "version": "latest", "episodes": 1, "seed": 7})
        evals = []

        def both_evals_back() -> bool:
            message = d.next_result(timeout=1.0)
            if message is not None:
                evals.append(message)
            return len(evals) == 2

        poll(both_evals_back, "both evaluation results")
        assert sorted(m.kind for m in evals) == ["eval", "eval"]
        sent = {tid for ids in d.stats.task_ids.values() for tid in ids}

        # Every task, by name and state, with its short label instead of a dict repr.
        def flower_tasks():
            status, body = _request(f"{base}/api/tasks", auth)
            tasks = json.loads(body) if status == 200 else {}
            done = {tid: t for tid, t in tasks.items() if tid in sent and t.get("state") == "SUCCESS"}
            return done if len(done) == len(sent) else None

        tasks = poll(
            flower_tasks, "all 5 tasks as SUCCESS in flower's /api/tasks", flower, tmp_path / "flower.log", DEADLINE
        )
        by_name = {}
        for t in tasks.values():
            by_name.setdefault(t["name"], []).append(t)
        assert set(by_name) == {ROLLOUT_TASK, EVAL_TASK}
        assert len(by_name[ROLLOUT_TASK]) == 3 and len(by_name[EVAL_TASK]) == 2
        labels = sorted(t["kwargs"] for t in by_name[ROLLOUT_TASK])
        assert labels == [f"run=flower v=0 it=0 idx={i} steps=32 seed=5 env=CartPole-v1" for i in range(3)]
        assert sorted(t["kwargs"] for t in by_name[EVAL_TASK]) == [
            f"run=flower v=latest it=0 idx={i} episodes=1 seed=7 env=CartPole-v1" for i in range(2)
        ]
        assert all(t["args"] == "()" and t["worker"] in farm._nodes for t in tasks.values())

        # A task that fails on its worker (here: a version the run never published) is FAILURE, with
        # the line its trainer was told as the exception; so is a refused one (tests/test_tamper.py).
        d.submit({"kind": "eval", "iteration": 1, "index": 0, "version": 99, "episodes": 1, "seed": 7})
        [failing] = d.stats.task_ids[("eval", 1, 0)]

        def flower_failure():
            status, body = _request(f"{base}/api/task/info/{failing}", auth)
            task = json.loads(body) if status == 200 else {}
            return task if task.get("state") == "FAILURE" else None

        failure = poll(
            flower_failure, "the failed task as FAILURE in flower", flower, tmp_path / "flower.log", DEADLINE
        )
        assert failure["exception"].startswith("TaskFailed(") and "99" in failure["exception"], failure

        status, body = _request(f"{base}/api/workers?refresh=1", auth)
        assert status == 200 and set(json.loads(body)) == set(farm._nodes)

        # Without credentials: reads and remote control are refused, and the worker is untouched.
        node = farm._nodes[0]
        assert _request(f"{base}/api/workers", None)[0] == 401
        assert _request(f"{base}/api/tasks", None)[0] == 401
        assert _request(f"{base}/tasks", None)[0] == 401
        assert _request(f"{base}/api/worker/pool/restart/{node}", None, "POST")[0] == 401
        assert _request(f"{base}/api/task/revoke/{next(iter(sent))}", None, "POST")[0] == 401
        assert _request(f"{base}/api/worker/shutdown/{node}", f"rlfarm:{secrets.token_urlsafe(12)}", "POST")[0] == 401
        assert farm.worker_procs[0].poll() is None
        assert make_app(farm.redis_url).control.ping(destination=[node], timeout=5.0)
    finally:
        stop_process_group(flower, grace=10.0)
        log.close()
    assert auth.split(":")[1] not in (tmp_path / "flower.log").read_text(errors="replace")

"""ASYNC mode on real Redis + Celery: staleness control, a killed worker, bounded Redis memory."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from rlfarm.farm.app import make_app

from .conftest import (
    WORKER_ENV,
    assert_cleaned_up,
    pid_alive,
    poll,
    read_summary,
    rlfarm_cmd,
    run_cli,
    running_tasks,
    start_command,
)

pytestmark = pytest.mark.farm

SMALL_DQN = [
    "--preset",
    "cartpole-dqn",
    "--set",
    "policy.hidden_sizes=[32,32]",
    "--set",
    "dqn.learning_starts=256",
    "--set",
    "dqn.replay_ratio=0.25",
    "--set",
    "eval.interval=0",
    "--set",
    "target_return=inf",
]


@pytest.mark.parametrize("max_lag, stale_expected", [(1, True), (100_000, False), ("auto", False)])
def test_stale_results_are_dropped_and_counted(farm, tmp_path, max_lag, stale_expected):
    """4 tasks in flight, 128 versions per result (512 steps x replay 0.25 / 1): lag is at least 128,
    so a bound of 1 drops results; "auto" (2 x 4 x 128 = 1024) keeps them all."""
    run_id = f"stale-{max_lag}"
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "6000",
        *SMALL_DQN,
        "--set",
        f"async.max_policy_lag={max_lag}",
        "--set",
        "async.tasks_in_flight=4",
        "--set",
        "async.publish_interval=1",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = read_summary(tmp_path / run_id)
    rows = list(csv.DictReader(open(tmp_path / run_id / "progress.csv")))
    logged = int(rows[-1]["farm/results_dropped_stale"])
    assert logged == summary["dropped_stale"]
    assert summary["env_steps"] >= 6000  # counted from consumed results only
    if stale_expected:
        assert summary["dropped_stale"] > 0
        assert max(int(r["farm/policy_lag_max"]) for r in rows) > 0
    else:
        assert summary["dropped_stale"] == 0
    assert summary["max_policy_lag"] == (1024 if max_lag == "auto" else max_lag)


def test_sigkilled_worker_during_async_run(farm, tmp_path):
    """Training goes on to the end; the killed task is replaced; no task id is counted twice."""
    run_id = "async-kill"
    args = [
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "12000",
        *SMALL_DQN,
        "--env",
        "tests.tiny_envs:slow",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=500",
        "--set",
        "farm.task_timeout=4",
    ]
    # The run (24 results of at least 1 s on 2 processes) outlasts the 4 s deadline, so the killed task
    # is replaced one way or the other before the end: redelivered by Celery (same task id) or, if that
    # is slow (a loaded machine restarting the pool process), re-sent by the trainer.
    proc = subprocess.Popen(
        rlfarm_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **WORKER_ENV}
    )
    app = make_app(farm.redis_url)
    # A task that started at most 0.5 s before the farm's one worker node's reply came has 0.5 s of
    # sleeping steps left, so the kill lands inside it however slow the reply was; an older one may have
    # ended in between (a CI run killed an idle pool process that way: no task lost, nothing to see).
    running = poll(
        lambda: running_tasks(app, run_id, started_within=0.5, nodes=1), "a task of the run just started", proc
    )
    victim, task_id = running[0]
    os.kill(victim, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]

    # The kill mattered: the process died with a task in hand (Celery's pool says so, and raises
    # WorkerLostError only for a process that had a job running).
    def lost_with_a_job() -> bool:
        for path in Path(farm.log_dir).glob("worker-*.log"):
            lines = path.read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if f"pid:{victim} exited with 'signal 9" in line:
                    return any("WorkerLostError" in later for later in lines[i + 1 : i + 4])
        return False

    poll(lost_with_a_job, f"pool process {victim} lost with its task")
    assert not pid_alive(victim)
    summary = read_summary(tmp_path / run_id)
    assert summary["env_steps"] >= 12000
    ids = summary["accepted_task_ids"]
    assert len(ids) == len(set(ids)) == summary["task_ids_accepted"]  # none counted twice
    # Its result was lost with the process, so what counts for it is a copy run again: redelivered by
    # Celery (the same task id) or re-sent by the trainer (a new one).
    assert task_id in ids or summary["redispatched"] > 0


def test_redis_memory_stays_bounded_in_a_1_minute_async_run(tmp_path):
    """used_memory after a minute of ASYNC training stays within 1 MiB of its 10 s value: a leak of
    20 kB/s shows, as with 2 MiB over the two minutes this ran before the suite had to fit 20 minutes
    (sampled every 5 s over two minutes, used_memory moved within 0.5 MB of 2.2 MB, with no trend)."""
    run_id = "memory"
    proc = start_command(
        "train",
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--preset",
        "cartpole-dqn",
        "--total-steps",
        "100000000",
        "--set",
        "target_return=inf",
        "--set",
        "eval.interval=20000",
        env={**os.environ, **WORKER_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / run_id

    def run_seconds() -> float:  # the trainer's own clock, from progress.csv
        path = run_dir / "progress.csv"
        lines = path.read_text().splitlines() if path.exists() else []
        return float(lines[-1].split(",")[1]) if len(lines) > 1 else 0.0

    memory = {}
    try:
        for mark in (10, 60):
            poll(
                lambda mark=mark: run_seconds() >= mark,
                f"{mark} s of training by the trainer's clock",
                proc,
                deadline_s=10 * mark,
            )
            url = json.loads((run_dir / "cluster.json").read_text())["redis_url"]
            memory[mark] = redis.Redis.from_url(url).info("memory")["used_memory"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    print(f"Redis used_memory: {memory[10]} bytes after 10 s, {memory[60]} bytes after 60 s")
    assert memory[60] <= memory[10] + 1024 * 1024
    assert_cleaned_up(run_dir, run_id)


# APPO with a deliberately slow update (60 epochs of a 256-step result): the learner sets the pace.
def slow_learner_run(farm, tmp_path, run_id: str, tasks_in_flight: str):
    return run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--mode",
        "async",
        "--total-steps",
        "8192",
        *("--set", "env.num_envs=1", "--set", "farm.steps_per_env=256"),
        *("--set", "ppo.num_minibatches=2", "--set", "ppo.update_epochs=60"),
        *("--set", f"async.tasks_in_flight={tasks_in_flight}", "--set", "async.results_per_update=1"),
    )


def test_a_slow_learner_applies_back_pressure_and_says_how_long_the_farm_waited(farm, tmp_path):
    """APPO with a deliberately slow update (many epochs): results keep being taken in between its
    minibatches, but never more than a bounded backlog; finished tasks wait for replacement, and the
    fraction of slot time they waited is logged, in summary.json, and in the trainer's heartbeat, with
    the fraction of the time the learner computed."""
    run_id = "slow-learner"
    result = slow_learner_run(farm, tmp_path, run_id, "4")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / run_id / "progress.csv")))
    assert max(int(r["farm/backlog"]) for r in rows) <= 4  # bounded: max_backlog = tasks in flight
    waiting = [float(r["farm/slots_waiting"]) for r in rows]
    assert all(0.0 <= w <= 1.0 for w in waiting) and max(waiting) > 0.0
    busy = [float(r["farm/learner_busy"]) for r in rows]  # and the learner was what they waited for
    assert all(0.0 <= b <= 1.0 for b in busy) and max(busy) > 0.3, busy
    summary = read_summary(tmp_path / run_id)
    assert 0.0 < summary["slots_waiting"] <= 1.0
    assert summary["env_steps"] >= 8192
    status = redis.Redis.from_url(farm.redis_url).hgetall(f"rlfarm:{run_id}:status")
    assert b"slots_waiting" in status


def test_auto_tasks_in_flight_follow_a_slow_learner_down_to_one(farm, tmp_path):
    """`async.tasks_in_flight = "auto"` on a farm of 2 processes whose learner is the slower side
    (60 epochs a result): the window falls to the one task that keeps it fed, and the lag with it,
    where a fixed 2 keeps a result and a task waiting behind every one (2 or more versions)."""
    run_id = "paced"
    result = slow_learner_run(farm, tmp_path, run_id, "auto")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / run_id / "progress.csv")))
    windows = [int(r["farm/window"]) for r in rows]
    assert windows[0] == 2 and windows[-1] == 1, windows  # the farm's 2 processes, then the pace's 1
    summary = read_summary(tmp_path / run_id)
    assert summary["tasks_in_flight"] == {"cap": 2, "paced": True, "last": 1}
    late = [float(r["farm/policy_lag"]) for r in rows[len(rows) // 2 :] if int(r["farm/window"]) == 1]
    assert late and max(late) <= 1.5, late
    assert summary["env_steps"] >= 8192


def test_a_batch_of_more_results_than_tasks_in_flight_fills_over_rounds(farm, tmp_path):
    """5 results an update with 2 tasks in flight: each update waits for a third round of tasks,
    as a farm of 5 would fill it in one; the run learns what its config says on either."""
    run_id = "k5"
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--mode",
        "async",
        "--total-steps",
        "20480",
        "--set",
        "async.results_per_update=5",
        "--set",
        "async.tasks_in_flight=2",
        "--set",
        "eval.interval=0",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = read_summary(tmp_path / run_id)
    steps_per_result = 4 * 512  # cartpole-ppo: a task is 4 envs x 512 steps
    assert summary["env_steps"] >= 20480
    # 10 results learned 5 at a time, a version each: 2, and none for a part batch left over
    assert summary["final_version"] == summary["env_steps"] // (5 * steps_per_result)
    rows = list(csv.DictReader(open(tmp_path / run_id / "progress.csv")))
    assert max(int(r["farm/backlog"]) for r in rows) <= 5  # a batch waits for the learner, no more


def test_tasks_pick_up_newer_versions_while_they_run(farm, tmp_path):
    """async.refresh_steps: APPO with 8 tasks in flight on 2 workers and a version per result. Tasks
    started with an old version switch to the newest every 16 steps, so results end acting with newer
    versions than they started with (counted), and the lag at a task's end is below the lag at its
    start. The env sleeps 2 ms a step, so a task lasts about half a second whatever the machine's load:
    on CartPole a loaded CI machine made the learner the bottleneck, every in-flight task had finished
    before the next version was published, and none could pick it up."""
    from .conftest import read_csv

    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        "cartpole-appo",
        "--run-id",
        "refresh",
        "--env",
        "tests.tiny_envs:slow",
        "--set",
        "env.num_envs=1",
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "8000",
        "--set",
        "async.tasks_in_flight=8",
        "--set",
        "async.results_per_update=1",
        "--set",
        "async.refresh_steps=16",
        "--set",
        "farm.steps_per_env=256",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = read_summary(tmp_path / "refresh")
    assert summary["results_refreshed"] > 0
    rows = [row for row in read_csv(tmp_path / "refresh" / "progress.csv") if int(row["policy_version"]) > 0]
    start = sum(float(row["farm/policy_lag"]) for row in rows)
    end = sum(float(row["farm/policy_lag_end"]) for row in rows)
    assert end < start, (start, end)

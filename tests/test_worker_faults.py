"""Faults of the workers themselves, done for real: a worker of another rlfarm version, a worker
stopped by SIGTERM (a spot instance's notice) mid-task, an env that hangs.

Each test starts its own redis-server and real workers on 127.0.0.1 (rlfarm.local.cluster.LocalCluster,
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
import redis

from rlfarm.core.protocol import PROTOCOL
from rlfarm.farm import keys
from rlfarm.local.cluster import LocalCluster

from .conftest import (
    ROOT,
    WORKER_ENV,
    TaskEvents,
    assert_nothing_lost_or_double_counted,
    one_error_line,
    poll,
    read_summary,
    run_cli,
    start_command,
)

pytestmark = [pytest.mark.farm, pytest.mark.fault]

RLFARM_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "WARNING"]
LOGGING_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "INFO"]  # logs each task it receives
SLOW_PPO = [
    "--preset",
    "cartpole-ppo",
    "--env",
    "tests.tiny_envs:slow",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "farm.steps_per_env=250",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
]


def cluster(tmp_path: Path, name: str, **env: str) -> LocalCluster:
    c = LocalCluster(
        workers=0,
        name=f"rlfarm-{name}-{os.getpid()}",
        log_dir=tmp_path,
        extra_env={**WORKER_ENV, "RLFARM_REDIS_OUTAGE_TIMEOUT": "300", **env},
    )
    c.start()
    return c


def train(c: LocalCluster, tmp_path: Path, run_id: str, *args: str) -> subprocess.Popen:
    return start_command(
        "train",
        "--redis",
        c.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        *args,
        env={**os.environ, **WORKER_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_log(c: LocalCluster, proc: subprocess.Popen) -> str:
    return (c.log_dir / f"worker-{c.worker_procs.index(proc)}.log").read_text(errors="replace")


def test_a_worker_stopped_by_an_unrecoverable_error_starts_again_and_its_run_finishes(tmp_path):
    """Celery stops a worker whose consumer meets an error it cannot recover from ("Unrecoverable
    error", exit 1): after a Sentinel failover, an ack on a connection kombu had torn down half-way
    raised AttributeError 'hostname', and the run waited forever for the worker (issue 50). Now
    `rlfarm worker` starts again in the same process, says so in one line, and the run finishes.
    The first ack on the machine raises that very error (tests/worker_consumer_crash.py)."""
    marker = tmp_path / "crashed-once"
    c = cluster(tmp_path, "unrecoverable")
    try:
        worker = c.add_worker(
            1, command=[sys.executable, "-m", "tests.worker_consumer_crash", str(marker), "worker", "-l", "INFO"]
        )
        proc = train(c, tmp_path, "unrecoverable", *SLOW_PPO, "--total-steps", "2000")
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        log = worker_log(c, worker)
        assert marker.exists() and "Unrecoverable error: AttributeError" in log, log[-3000:]
        assert "the worker stopped on an error it cannot recover from" in log and "(1 of at most 20" in log
        assert worker.poll() is None  # the same process, started again
        assert_nothing_lost_or_double_counted(read_summary(tmp_path / "unrecoverable"), 250)
    finally:
        c.stop()


# ---- item 9: a worker of another version ---------------------------------------------------------
def test_a_worker_of_another_protocol_never_takes_a_task_and_the_run_goes_on_with_the_others(tmp_path):
    """One `rlfarm worker` of this version and one that speaks protocol PROTOCOL + 6, as a worker of
    another rlfarm does: tasks travel on the queue of their protocol, so the other worker never takes
    one (nothing refused, nothing re-sent, no warning), the current worker runs them all, and
    `rlfarm status` shows each worker's version. Before, the other worker took and refused re-sent
    tasks about once a second while the current one sat idle."""
    other = PROTOCOL + 6
    c = cluster(tmp_path, "protocol")
    try:
        current = c.add_worker(1, command=LOGGING_WORKER)
        old = c.add_worker(
            1, command=[sys.executable, "-m", "tests.worker_of_protocol", str(other), "worker", "-l", "INFO"]
        )
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
        assert s["env_steps"] >= 2000
        assert s["faults"]["refused"] == 0 and s["redispatched"] == 0, s
        assert "refuses this run's tasks" not in stderr and "Traceback" not in stderr
        log = worker_log(c, old)
        assert "ProtocolMismatch" not in log and "rlfarm.rollout[" not in log, log[-3000:]
        assert "rlfarm.rollout[" in worker_log(c, current)  # what a task taken looks like in a log
        ids = s["accepted_task_ids"]
        assert len(ids) == len(set(ids)) and s["env_steps"] == len(ids) * 250
    finally:
        c.stop()


# Workers of earlier releases, run from this checkout's history: the last commit whose workers knew no
# protocol version, and the last release of protocol 4 (tasks on Celery's default queue).
EARLIER_RELEASES = {"before-protocols": "d89333a", "protocol-4": "98883e1"}


@pytest.mark.parametrize("release", list(EARLIER_RELEASES))
def test_a_worker_of_an_earlier_release_never_takes_a_task_of_this_one(tmp_path, release):
    """A real worker of an earlier commit beside one of this checkout: it consumes Celery's default
    queue, this trainer's tasks travel on its protocol's queue, so it takes none of them: nothing
    refused or re-sent, the current worker runs every task, the run goes as with it alone. Before,
    the old worker took the re-sent tasks about once a second (117 deliveries for 20 tasks) and the
    run took 118 s instead of 6.7 s."""
    commit = EARLIER_RELEASES[release]
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"this checkout has no git history with {commit}: {archive.stderr[-200:]!r}")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    c = cluster(tmp_path, "legacy", PYTHONPATH=str(old))
    try:
        old_worker = c.add_worker(1, command=[sys.executable, str(old / "cli.py"), "worker", "-l", "INFO"])
        c.extra_env["PYTHONPATH"] = WORKER_ENV["PYTHONPATH"]
        current = c.add_worker(1, command=LOGGING_WORKER)
        proc = train(c, tmp_path, "legacy", *SLOW_PPO, "--total-steps", "2000")
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        assert "refuses this run's tasks" not in stderr, stderr[-3000:]
        s = read_summary(tmp_path / "legacy")
        assert s["faults"]["refused"] == 0 and s["redispatched"] == 0, s
        assert s["env_steps"] >= 2000 and len(s["accepted_task_ids"]) == len(set(s["accepted_task_ids"]))
        log = worker_log(c, old_worker)
        assert "rlfarm.rollout[" not in log and "unknown fields" not in log, log[-3000:]
        assert "rlfarm.rollout[" in worker_log(c, current)  # what a task taken looks like in a log
    finally:
        c.stop()


def test_a_worker_without_the_farms_secret_says_so_stops_and_the_run_goes_on(tmp_path, monkeypatch):
    """A farm that signs (RLFARM_SECRET) and a worker started without the secret, the way a new user
    adds one: before, the trainer dropped its unsigned results and waited forever, silently. Now the
    worker refuses its first task in one line that says where the secret is and stops; the trainer
    sends the task again, warns once naming the worker, and the run finishes on a worker that has it.
    The refused task is a failed one in Celery (its `task-failed` event, what Flower shows), not a
    success."""
    secret = "a-farm-secret-0123456789abcdef"
    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    c = cluster(tmp_path, "nosecret")
    try:
        bad = c.add_worker(1, command=[*RLFARM_WORKER, "-E"])  # no RLFARM_SECRET in its environment
        with TaskEvents(c.redis_url) as events:
            proc = start_command(
                "train",
                "--redis",
                c.redis_url,
                "--run-id",
                "nosecret",
                "--logdir",
                str(tmp_path),
                *SLOW_PPO,
                "--total-steps",
                "2000",
                env={**os.environ, **WORKER_ENV, "RLFARM_SECRET": secret},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            poll(lambda: bad.poll() is not None, "the worker without the secret to stop", proc)
            refused = poll(
                lambda: [e for e in events.of("task-failed") if "NoSecret:" in e.get("exception", "")],
                "the refused task's task-failed event",
                proc,
            )
        c.extra_env["RLFARM_SECRET"] = secret
        c.add_worker(1, command=RLFARM_WORKER)
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
    finally:
        c.stop()
    assert len(refused) == 1 and refused[0]["hostname"] == c._nodes[0]
    assert "TaskFailed" in refused[0]["exception"] and "has no RLFARM_SECRET" in refused[0]["exception"]
    assert refused[0]["uuid"] not in {e["uuid"] for e in events.of("task-succeeded")}
    lines = [line for line in worker_log(c, bad).splitlines() if "NoSecret:" in line]
    assert len(lines) == 1 and "has no RLFARM_SECRET" in lines[0] and "local-farm.json" in lines[0], lines
    warned = [line for line in stderr.splitlines() if "it has no RLFARM_SECRET" in line]
    assert len(warned) == 1 and warned[0].startswith("rlfarm: warning: dropped a result of run"), stderr[-3000:]
    assert "give every worker the farm's secret; sending its task again" in warned[0]
    s = read_summary(tmp_path / "nosecret")
    assert s["env_steps"] >= 2000 and s["redispatched"] >= 1
    assert len(s["accepted_task_ids"]) == len(set(s["accepted_task_ids"]))


# ---- item 8: SIGTERM to a worker mid-task (a spot instance's notice) ------------------------------
def _active_on(c: LocalCluster, node: str, run_id: str) -> list[str]:
    """Ids of the tasks of `run_id` that worker `node` is running right now."""
    from rlfarm.farm.app import make_app

    app = make_app(c.redis_url)
    try:
        active = app.control.inspect(destination=[node], timeout=1.0).active() or {}
    finally:
        app.close()
    return [t["id"] for t in active.get(node, []) if t["kwargs"].get("run") == run_id]


def test_sigterm_hands_running_tasks_back_at_once_and_the_worker_exits(tmp_path):
    """SIGTERM to an `rlfarm worker` a few seconds into a ~20 s task: the task is handed back at
    once (its lease deleted, a `handed_back` answer), the trainer sends it again to the other worker
    and the run finishes with nothing counted twice, while the stopped worker has exited cleanly
    without finishing its task. Before, Celery's warm shutdown waited for the task to end."""
    c = cluster(tmp_path, "sigterm")
    try:
        victim = c.add_worker(1, command=[*RLFARM_WORKER, "--shutdown-grace", "5"])
        victim_node = c._nodes[0]
        c.add_worker(1)  # a plain `celery -A rlfarm.worker.app worker`, which takes the task handed back
        proc = train(
            c,
            tmp_path,
            "spot",
            "--preset",
            "cartpole-ppo",
            "--env",
            "tests.tiny_envs:long_slow",
            "--set",
            "env.num_envs=1",
            "--set",
            "farm.num_tasks=2",
            "--set",
            "farm.steps_per_env=20000",
            "--set",
            "ppo.num_minibatches=2",
            "--set",
            "policy.hidden_sizes=[16]",
            "--set",
            "eval.interval=0",
            "--total-steps",
            "40000",
        )
        [task_id] = poll(lambda: _active_on(c, victim_node, "spot"), "the worker runs a task", proc)
        client = redis.Redis.from_url(c.redis_url)
        poll(lambda: client.keys("rlfarm:spot:lease:*"), "its lease is held", proc)
        sent = time.monotonic()
        victim.send_signal(signal.SIGTERM)
        code = victim.wait(timeout=600)  # a guard against a hang, not a measurement
        print(f"SIGTERM to exit: {time.monotonic() - sent:.1f} s")
        assert code == 0
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        assert (
            f"was handed back by {victim_node}: worker {victim_node} is shutting down (SIGTERM); sending it again"
        ) in stderr
        s = read_summary(tmp_path / "spot")
        assert s["faults"]["handed_back"] == 1 and s["faults"]["leases_expired"] == 0
        assert task_id not in s["accepted_task_ids"]  # the stopped worker never finished it
        ids = s["accepted_task_ids"]
        assert len(ids) == len(set(ids)) == 2 and s["env_steps"] == 40000  # nothing counted twice
        assert "handing back 1 running task" in worker_log(c, victim)
    finally:
        c.stop()


# ---- item 7: an env that hangs in C code holding the GIL ------------------------------------------
def test_an_env_hung_holding_the_gil_keeps_its_lease_and_its_time_limit_names_it(tmp_path):
    """step() blocks forever in C code that holds the GIL: no thread of the pool process runs again,
    so the lease its thread renews would expire and the task be taken for a lost worker. The
    worker's main process renews it instead: a minute in, the console says what runs where, for how
    long and what limit applies; at the time limit the process is killed and the run fails with the
    time limit and the env named, never a lost worker."""
    c = cluster(tmp_path, "hang-gil")
    try:
        c.add_worker(1, command=RLFARM_WORKER)
        proc = train(
            c,
            tmp_path,
            "hang-gil",
            *SLOW_PPO,
            "--env",
            "tests.tiny_envs:hang_gil",
            "--set",
            "farm.num_tasks=1",
            "--set",
            "farm.task_time_limit=75",
            "--set",
            "farm.max_redispatch=0",
            "--total-steps",
            "250",
        )
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 1, stderr[-3000:]
        line = one_error_line(stderr)
        assert "TimeLimitExceeded" in line and "time limit of 75" in line, line
        assert "in env tests.tiny_envs:hang_gil" in line and "hung env" in line, line
        assert "was lost" not in stderr and "lease expired" not in stderr  # the lease outlived the hang
        [notice] = [x for x in stderr.splitlines() if "no task has finished for" in x]
        assert notice.startswith("rlfarm: warning: no task has finished for 6"), notice  # a minute in
        assert "running: task rollout (iteration 0, index 0) for " in notice and " s on " in notice
        assert "time limit of 75 s (farm.task_time_limit" in notice
    finally:
        c.stop()


def test_the_time_limit_a_task_gets_is_described_with_its_source(redis_only):
    from .conftest import task_channel

    d = task_channel(redis_only.redis_url, "limits")
    assert (
        "time limit of 600 s (farm.task_time_limit 0: 600 s until a rollout task has finished"
        in d.outbox.describe_time_limit("rollout")
    )
    d.outbox.ledger.longest["rollout"] = 2.0
    assert (
        "time limit of 60 s (farm.task_time_limit 0: 10x the longest rollout task, at least 60 s"
        in d.outbox.describe_time_limit("rollout")
    )
    d.outbox.time_limit = 30.0
    assert "time limit of 30 s (farm.task_time_limit;" in d.outbox.describe_time_limit("rollout")


def test_a_process_that_does_not_let_go_is_answered_for_and_killed_after_the_grace(tmp_path):
    """The first task hangs deaf to the hand-back signal (an env stuck in C code): on SIGTERM the
    worker's main process waits --shutdown-grace, then answers for the task and kills the process;
    the worker exits, the trainer re-sends the task, the other worker runs it and the run finishes."""
    marker = tmp_path / "hung-deaf"
    c = cluster(tmp_path, "deaf", RLFARM_TEST_HANG_MARKER=str(marker))
    try:
        victim = c.add_worker(1, command=[*RLFARM_WORKER, "--shutdown-grace", "3"])
        victim_node = c._nodes[0]
        proc = train(
            c,
            tmp_path,
            "deaf",
            *SLOW_PPO,
            "--env",
            "tests.tiny_envs:hang_deaf_once",
            "--set",
            "farm.num_tasks=1",
            "--set",
            "eval.interval=0",
            "--total-steps",
            "500",
        )
        poll(marker.exists, "the first task hangs", proc)
        poll(lambda: _active_on(c, victim_node, "deaf"), "the worker reports it running", proc)
        c.add_worker(1)  # the other worker, free to take the task once it is handed back
        victim.send_signal(signal.SIGTERM)
        assert victim.wait(timeout=600) == 0  # a guard against a hang, not a measurement
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        assert "did not let go of the task within --shutdown-grace 3 s and was killed; sending it again" in stderr, (
            stderr[-3000:]
        )
        s = read_summary(tmp_path / "deaf")
        assert s["faults"]["handed_back"] == 1 and s["faults"]["leases_expired"] == 0
        ids = s["accepted_task_ids"]
        assert len(ids) == len(set(ids)) and s["env_steps"] == 250 * len(ids) >= 500
    finally:
        c.stop()


def test_a_burst_of_sigterms_runs_celerys_shutdown_handler_once_and_ends_the_worker(tmp_path):
    """Several SIGTERMs in a row (a supervisor repeating itself, a death signal beside a stop): Celery's
    SIGTERM handler runs for the first only (rlfarm.worker.hooks._term_once) and the worker exits. That
    guard is for a worker once found deadlocked in four nested runs of the handler (py-spy:
    `Signal._live_receivers` waiting for its own lock). This burst does not reproduce that race; what
    it holds is that the handler, which prints "worker: Warm shutdown (MainProcess)" each time it runs,
    ran once: without the guard the SIGTERMs sent after the first was handled ran it again. The
    nesting itself is held in process by tests/test_guards_mutation.py."""
    c = cluster(tmp_path, "termburst")
    log = tmp_path / "worker-0.log"  # the worker's stdout and stderr (LocalCluster.add_worker)
    try:
        victim = c.add_worker(2, command=[*RLFARM_WORKER, "--shutdown-grace", "5"])
        client = redis.Redis.from_url(c.redis_url)
        poll(lambda: client.zcard(keys.NODES), "the worker up and registered (worker_ready)")
        victim.send_signal(signal.SIGTERM)
        poll(lambda: SHUTDOWN in log.read_text() or victim.poll() is not None, "the first SIGTERM handled")
        for _ in range(50):
            if victim.poll() is not None:
                break
            victim.send_signal(signal.SIGTERM)
        poll(lambda: victim.poll() is not None, "the worker exiting after a burst of SIGTERMs", deadline_s=60)
    finally:
        c.stop()
    assert log.read_text().count(SHUTDOWN) == 1, log.read_text()[-3000:]


SHUTDOWN = "worker: Warm shutdown (MainProcess)"  # what Celery's SIGTERM handler prints each time it runs

"""Faults a farm meets, done for real against real processes: Redis restarted or flushed mid-run,
a worker's whole process group SIGKILLed, an env that hangs, results larger than a limit, a full Redis.

Each test starts its own redis-server (with an append-only file where a restart must keep the data)
and its own workers of both kinds, `rlfarm worker` and plain `celery -A tasks worker`, and drives the
real `rlfarm train` command.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from kombu.exceptions import OperationalError

from rlfarm.core import codec
from rlfarm.farm import keys
from rlfarm.farm.app import make_app
from rlfarm.local.cluster import LocalCluster, RedisSpec

from .conftest import (
    ROOT,
    WORKER_ENV,
    assert_nothing_lost_or_double_counted,
    one_error_line,
    pid_alive,
    poll,
    read_csv,
    read_summary,
    run_command,
    start_command,
)

pytestmark = [pytest.mark.farm, pytest.mark.fault]

RLFARM_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "WARNING"]
# The plain Celery way from docs/deploy.md, with Celery's defaults (gossip and mingle on).
CELERY_WORKER = [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-O", "fair", "-l", "WARNING"]
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
SLOW_DQN = [
    "--preset",
    "cartpole-dqn",
    "--mode",
    "async",
    "--env",
    "tests.tiny_envs:slow",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=250",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "dqn.learning_starts=256",
    "--set",
    "dqn.replay_ratio=0.1",
    "--set",
    "eval.interval=0",
    "--set",
    "target_return=inf",
]


class Farm:
    """A redis-server with an append-only file plus one `rlfarm worker` and one `celery -A tasks
    worker` (one pool process each), all on 127.0.0.1, stopped by pid at the end."""

    def __init__(
        self, tmp_path: Path, concurrency: int = 1, worker_env: dict | None = None, redis_args: list[str] | None = None
    ):
        self.cluster = LocalCluster(
            workers=0,
            name=f"rlfarm-faults-{os.getpid()}",
            log_dir=tmp_path,
            # workers wait out Redis outages as on a real farm (300 s)
            extra_env={**WORKER_ENV, "RLFARM_REDIS_OUTAGE_TIMEOUT": "300", **(worker_env or {})},
            redis=RedisSpec(args=("--appendonly", "yes", "--appendfsync", "always", *(redis_args or []))),
        )
        self.tmp_path = tmp_path
        self.cluster.start()
        self.rlfarm_worker = self.cluster.add_worker(concurrency, command=RLFARM_WORKER)
        self.celery_worker = self.cluster.add_worker(concurrency, command=CELERY_WORKER)

    @property
    def url(self) -> str:
        return self.cluster.redis_url

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def train(self, run_id: str, *args: str) -> subprocess.Popen:
        return start_command(
            "train",
            "--redis",
            self.url,
            "--run-id",
            run_id,
            "--logdir",
            str(self.tmp_path),
            *args,
            env={**os.environ, **WORKER_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def workers_alive(self) -> bool:
        """Both worker main processes still run and answer a broadcast ping."""
        if not all(p.poll() is None for p in (self.rlfarm_worker, self.celery_worker)):
            return False
        app = make_app(self.url)
        try:
            for _ in range(20):  # a restarted consumer may take a few pings to answer again
                try:
                    answers = app.control.ping(timeout=1.0)
                except (redis.ConnectionError, OperationalError):  # this process's pooled connection
                    continue  # from before the restart fails once, then reconnects
                if len(answers) == 2:
                    return True
            return False
        finally:
            app.close()

    def stop(self) -> None:
        self.cluster.stop()


def progress_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "progress.csv"
    return read_csv(path) if path.exists() else []


def wait_for_rows(proc: subprocess.Popen, run_dir: Path, rows: int = 1) -> None:
    """Until the trainer has logged `rows` rows (it is training), or fail if it died."""
    poll(lambda: len(progress_rows(run_dir)) >= rows, f"{rows} logged iterations", proc)


@pytest.fixture
def fault_farm(tmp_path):
    farm = Farm(tmp_path)
    yield farm
    farm.stop()


@pytest.mark.parametrize("mode, outage", [("sync", 1.0), ("sync", 10.0), ("async", 1.0), ("async", 10.0)])
def test_redis_restart_mid_run_is_ridden_out(fault_farm, tmp_path, mode, outage):
    """SIGTERM the redis-server mid-run, start it again from its append-only file `outage` s later:
    the trainer and both kinds of worker wait, say so, and finish the run with nothing lost."""
    run_id = f"restart-{mode}-{int(outage)}"
    args = SLOW_PPO + ["--total-steps", "4000"] if mode == "sync" else SLOW_DQN + ["--total-steps", "3000"]
    proc = fault_farm.train(run_id, *args)
    wait_for_rows(proc, tmp_path / run_id)
    fault_farm.cluster.stop_redis(signal.SIGTERM)
    time.sleep(outage)  # the outage itself
    fault_farm.cluster.start_redis(same_port=True)
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert "rlfarm: warning: lost Redis at" in stderr and "is back after" in stderr
    assert "Traceback" not in stderr
    s = read_summary(tmp_path / run_id)
    assert s["faults"]["redis_outages"] >= 1
    assert s["env_steps"] >= (4000 if mode == "sync" else 3000)
    assert_nothing_lost_or_double_counted(s, 250)
    assert fault_farm.workers_alive()


def test_outage_past_the_limit_is_one_line_and_the_run_resumes(fault_farm, tmp_path):
    run_id = "outage-limit"
    proc = fault_farm.train(run_id, *SLOW_PPO, "--total-steps", "3000", "--set", "farm.redis_outage_timeout=3")
    wait_for_rows(proc, tmp_path / run_id)
    fault_farm.cluster.stop_redis(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=600)
    fault_farm.cluster.start_redis(same_port=True)
    assert proc.returncode == 1
    line = one_error_line(stderr)
    assert "unreachable for more than 3 s" in line and f"rlfarm train --resume {run_id}" in line
    resumed = run_command(
        "train",
        "--redis",
        fault_farm.url,
        "--resume",
        run_id,
        "--logdir",
        str(tmp_path),
        env={**os.environ, **WORKER_ENV},
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_summary(tmp_path / run_id)["env_steps"] >= 3000
    assert fault_farm.workers_alive()


def test_a_stalled_redis_is_named_as_a_stall_not_a_lost_one(tmp_path):
    """`DEBUG SLEEP 15` freezes Redis with its connections open (as a slow command or a fork for a
    save does): the trainer says Redis did not answer and when it answered again, once each, with
    the stall's real length, and the run goes on; before, it printed "lost Redis ... back after
    0.1 s" pairs (a reconnect to the sleeping server counted as the end of the outage)."""
    farm = Farm(tmp_path, redis_args=["--enable-debug-command", "local"])
    try:
        run_id = "stall"
        proc = farm.train(run_id, *SLOW_DQN, "--total-steps", "3000")
        wait_for_rows(proc, tmp_path / run_id)
        # no socket timeout and no retry: this client must not re-send the sleep
        redis.Redis.from_url(farm.url, socket_timeout=None, retry=None).execute_command("DEBUG", "SLEEP", "15")
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        stalled = [line for line in stderr.splitlines() if "did not answer for" in line]
        back = [line for line in stderr.splitlines() if "answered again after" in line]
        assert len(stalled) == 1 and "stalled" in stalled[0], stderr[-3000:]
        assert len(back) == 1, stderr[-3000:]
        assert float(back[0].split("answered again after ")[1].split(" s")[0]) >= 10  # the stall timeout
        assert "lost Redis" not in stderr and "is back after" not in stderr
        s = read_summary(tmp_path / run_id)
        assert s["faults"]["redis_outages"] >= 1
        assert_nothing_lost_or_double_counted(s, 250)
    finally:
        farm.stop()


def _pool_pids(url: str) -> set[int]:
    app = make_app(url)
    try:
        stats = app.control.inspect(timeout=2.0).stats() or {}
    finally:
        app.close()
    return {pid for s in stats.values() for pid in s["pool"]["processes"]}


def _stop_cleanly(proc: subprocess.Popen) -> int:
    """SIGTERM a worker's main process (warm shutdown) and return its exit code."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=120)  # a guard against a hang, not a measurement


def test_hung_env_hits_the_run_time_limit_and_the_stuck_process_is_replaced(tmp_path):
    """An env whose step() never returns: the task is killed at farm.task_time_limit, its pool
    process replaced, the task re-sent, and the run fails with the time limit as the cause."""
    hung_pids = tmp_path / "hung-pids"
    farm = Farm(tmp_path, worker_env={"RLFARM_TEST_HUNG_PIDS": str(hung_pids)})
    try:
        assert len(_pool_pids(farm.url)) == 2
        proc = farm.train(
            "hang",
            *SLOW_PPO,
            "--env",
            "tests.tiny_envs:hang",
            "--total-steps",
            "2000",
            "--set",
            "farm.task_time_limit=3",
            "--set",
            "farm.max_redispatch=1",
        )
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 1
        line = one_error_line(stderr)
        assert "TimeLimitExceeded" in line and "time limit of 3" in line and "hung env" in line, line
        assert "sent 2 times" in line

        def hung() -> set[int]:
            return {int(pid) for pid in hung_pids.read_text().split()}

        assert len(hung()) >= 2  # the failing task hung a process each time it was sent
        # Every stuck process is replaced. Polled: a pool process is replaced after its task's failure
        # is stored, so the trainer may see the failure first, and the sends may have reached one worker.
        poll(
            lambda: (lambda now: len(now) == 2 and not (now & hung()))(_pool_pids(farm.url)),
            "every stuck pool process replaced",
        )
        # Nothing is left stuck: both kinds of worker stop on SIGTERM by themselves.
        assert _stop_cleanly(farm.rlfarm_worker) == 0
        assert _stop_cleanly(farm.celery_worker) == 0
    finally:
        farm.stop()


def test_a_task_that_hangs_once_is_replaced_and_the_run_goes_on(tmp_path):
    """Only the first task to get there hangs; the workers' own time limit (`rlfarm worker
    --time-limit`, RLFARM_TASK_TIME_LIMIT for plain Celery) kills it, and the run finishes."""
    marker = tmp_path / "hung-once"
    farm = Farm(tmp_path, worker_env={"RLFARM_TASK_TIME_LIMIT": "3", "RLFARM_TEST_HANG_MARKER": str(marker)})
    try:
        proc = farm.train("hang-once", *SLOW_PPO, "--env", "tests.tiny_envs:hang_once", "--total-steps", "2000")
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert marker.exists()
        s = read_summary(tmp_path / "hang-once")
        assert s["faults"]["time_limits"] == 1
        assert "exceeded its time limit" in stderr or "TimeLimitExceeded" in stderr  # said on the console
        assert_nothing_lost_or_double_counted(s, 250)
    finally:
        farm.stop()


def test_a_stragglers_late_copy_leaves_no_env_stream_snapshot_behind(tmp_path):
    """farm.episodes = "continue": a straggler's copy saves its stream's snapshot with its result,
    which counts for nothing once the backup's has. It stayed in Redis for its 6 h expiry (issue 50);
    now the trainer deletes it when the late copy comes in, unless a stream stands at it. The first
    step of the run stalls 4 s; its backup (farm.task_timeout 0.5 s) goes on meanwhile."""
    marker = tmp_path / "stalled-once"
    env = {"RLFARM_TEST_HANG_MARKER": str(marker), "RLFARM_TEST_STALL_SECONDS": "4"}
    farm = Farm(tmp_path, worker_env=env)
    try:
        run = "late-snapshot"
        sets = ["farm.episodes=continue", "farm.num_tasks=1", "farm.steps_per_env=64", "farm.task_timeout=0.5"]
        sets += ["ppo.num_minibatches=2"]
        args = ["--preset", "cartpole-ppo", "--env", "tests.tiny_envs:stall_once", "--set", "env.num_envs=1"]
        args += [part for value in [*sets, "eval.interval=0", "target_return=inf"] for part in ("--set", value)]
        proc = farm.train(run, *args, "--total-steps", "2000")
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert marker.exists()
        summary = read_summary(tmp_path / run)
        assert summary["faults"]["stragglers"] >= 1 and summary["duplicates"] >= 1
        assert summary["streams"]["late_dropped"] >= 1
        client = farm.client()
        # Copies that came back after the trainer stopped reading are still in the results list: only
        # theirs may be left (nothing else is, the finished run deleted its streams' own).
        unread = {
            (codec.unpack(raw).get("stream") or {}).get("digest") for raw in client.lrange(keys.results(run), 0, -1)
        }
        left = {key.decode().rsplit(":", 1)[-1] for key in client.scan_iter(f"{keys.prefix(run)}stream:*")}
        assert left <= unread, (left, unread)
    finally:
        farm.stop()


def _running_on(app, run_id: str) -> set[str]:
    """Nodes running a task of `run_id` right now."""
    active = app.control.inspect(timeout=0.5).active() or {}
    return {node for node, tasks in active.items() if any(t["kwargs"].get("run") == run_id for t in tasks)}


def test_a_lost_whole_worker_is_noticed_by_its_lease_not_a_timeout(tmp_path):
    """SIGKILL a worker's whole process group (main and pool) mid SYNC iteration: its message is
    stuck unacked in kombu for the visibility timeout and no result will come, yet the iteration
    completes because the task's lease expires and the task is re-sent. task_timeout is an hour, so
    nothing else could have re-sent it before the test's own guard."""
    farm = Farm(tmp_path)
    try:
        proc = farm.train(
            "lost-worker",
            *SLOW_PPO,
            "--set",
            "farm.steps_per_env=1000",
            "--total-steps",
            "6000",
            "--set",
            "farm.task_timeout=3600",
            "--set",
            "farm.lease_seconds=3",
        )
        app = make_app(farm.url)
        celery_node = farm.cluster._nodes[1]
        poll(lambda: celery_node in _running_on(app, "lost-worker"), "a task running on the Celery worker", proc)
        os.killpg(farm.celery_worker.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert "was lost (its lease expired" in stderr
        s = read_summary(tmp_path / "lost-worker")
        assert s["faults"]["leases_expired"] >= 1
        assert s["env_steps"] >= 6000
        assert_nothing_lost_or_double_counted(s, 1000)
        collect = [float(r["farm/collect_seconds"]) for r in progress_rows(tmp_path / "lost-worker")]
        print(f"iteration collect seconds: {collect}")  # the killed iteration: lease (3 s) + one task
    finally:
        farm.stop()


def test_flushall_mid_run_is_noticed_written_back_and_the_run_goes_on(fault_farm, tmp_path):
    run_id = "flushed"
    proc = fault_farm.train(run_id, *SLOW_DQN, "--total-steps", "3000", "--set", "farm.lease_seconds=3")
    wait_for_rows(proc, tmp_path / run_id)
    fault_farm.client().flushall()
    _, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    assert stderr.count("state is gone from Redis") == 1  # warned once, on the console
    assert "state is gone from Redis" in (tmp_path / run_id / "rlfarm.log").read_text()  # and in the log
    s = read_summary(tmp_path / run_id)
    assert s["faults"]["state_restored"] == 1
    assert s["env_steps"] >= 3000
    assert_nothing_lost_or_double_counted(s, 250)
    # The run's metadata and policy are back: listed, and evaluable from Redis.
    listed = run_command("checkpoints", "list", "--redis", fault_farm.url)
    assert run_id in listed.stdout
    assert fault_farm.client().exists(f"rlfarm:{run_id}:meta")
    assert fault_farm.rlfarm_worker.poll() is None and fault_farm.celery_worker.poll() is None


def test_full_redis_is_one_clear_line(fault_farm, tmp_path):
    run_id = "full"
    proc = fault_farm.train(run_id, *SLOW_DQN, "--total-steps", "100000")
    wait_for_rows(proc, tmp_path / run_id)
    client = fault_farm.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")  # every write is refused from now on
    try:
        _, stderr = proc.communicate(timeout=600)
    finally:
        client.config_set("maxmemory", "0")
    assert proc.returncode == 1
    line = one_error_line(stderr)
    assert "is full (maxmemory reached" in line and f"--resume {run_id}" in line
    # the line the run ended with is the last line of its log, which is what a user keeps
    last = (tmp_path / run_id / "rlfarm.log").read_text().splitlines()[-1]
    assert " ERROR rlfarm.cli: " in last and last.endswith(line.removeprefix("rlfarm: error: "))


# Raw arrays (farm.compress=none): the wide env's all-zero observations would compress to a few KB.
WIDE = [
    "--env",
    "tests.tiny_envs:wide",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=1",
    "--set",
    "farm.steps_per_env=1000",
    "--set",
    "policy.hidden_sizes=[8]",
    "--set",
    "farm.compress=none",
    "--total-steps",
    "1000",
]


def test_results_over_100_mib_decode_and_over_the_limit_are_refused_by_the_worker(farm, tmp_path):
    """One task of 1,000 steps of 30,000 float32 observations is a ~115 MiB result: it travels and
    decodes (msgpack's default buffer limit of 100 MiB once ended such a run with an empty error);
    with farm.max_result_bytes below that, the worker refuses to send it and the run fails in one line."""
    ok = run_command(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "wide-ok",
        "--logdir",
        str(tmp_path),
        *WIDE,
        env={**os.environ, **WORKER_ENV},
        timeout=600,
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert read_summary(tmp_path / "wide-ok")["env_steps"] == 1000
    big = run_command(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "wide-big",
        "--logdir",
        str(tmp_path),
        *WIDE,
        "--set",
        "farm.max_result_bytes=52428800",
        env={**os.environ, **WORKER_ENV},
        timeout=600,
    )
    assert big.returncode == 1
    line = one_error_line(big.stderr)
    assert "ResultTooLarge" in line and "over farm.max_result_bytes (50.0 MiB)" in line
    assert "make tasks smaller" in line
    size = float(line.split("the result is ")[1].split(" MiB")[0])
    assert 110 < size < 120


def test_workers_skip_copies_already_counted_and_runs_already_ended(redis_only):
    """The check a worker makes before it starts a task, on a real Redis, in-process."""
    from rlfarm.core import codec
    from rlfarm.core.protocol import PROTOCOL
    from rlfarm.farm import keys
    from rlfarm.farm.claim import Claim
    from rlfarm.worker.handler import TaskHandler

    from .conftest import make_run

    make_run(redis_only.redis_url, "skips", ["env.num_envs=1"])
    client = redis.Redis.from_url(redis_only.redis_url)
    worker = TaskHandler(redis_only.redis_url)
    claim = Claim(client, "skips")  # what a live trainer holds
    spec = {
        "run": "skips",
        "iteration": 0,
        "index": 0,
        "version": 0,
        "steps": 8,
        "seed": 1,
        "incarnation": claim.incarnation,
        "protocol": PROTOCOL,
    }
    worker.handle(spec, "ended-run")  # no live trainer: dropped, nothing pushed
    assert client.llen(keys.results("skips")) == 0
    claim.acquire()
    client.sadd(keys.wanted("skips"), keys.LIVE, "rollout:0:0")
    worker.handle(spec, "first")  # wanted: runs, and takes its key out of the wanted set
    worker.handle(spec, "copy")  # already counted: skipped unrun, with a note
    first, copy = [codec.unpack(m) for m in client.lrange(keys.results("skips"), 0, -1)]
    assert first["task_id"] == "first" and first["rollout"]["rewards"].size == 8
    assert copy == {
        "kind": "rollout",
        "iteration": 0,
        "index": 0,
        "worker": worker.identity,
        "task_id": "copy",
        "incarnation": claim.incarnation,
        "skipped": True,
    }
    assert client.smembers(keys.wanted("skips")) == {keys.LIVE.encode()}
    claim.release()
    assert not client.keys("rlfarm:skips:lease:*") and not client.keys("rlfarm:skips:attempts:*")


def test_one_lease_thread_renews_each_task_while_it_runs_and_not_after(redis_only):
    """A worker process's lease thread, started by its first task and kept: it renews the running
    task's lease past its expiry, moves on to the next task's, and lets a released one expire."""
    from rlfarm.worker.lease import Lease

    client = redis.Redis.from_url(redis_only.redis_url)
    renewals: list[str] = []  # every SET the lease makes, in order

    class Recording(redis.Redis):
        def set(self, name, *args, **kwargs):
            renewals.append(name)
            return super().set(name, *args, **kwargs)

    def renewed(key: str, times: int, since: int = 0) -> bool:
        return renewals[since:].count(key) >= times

    lease = Lease(Recording.from_url(redis_only.redis_url))
    lease.hold("lease-test:a", "me", 1.0)  # expires 1 s after each renewal, renewed every 0.25 s
    poll(lambda: renewed("lease-test:a", 9), "8 renewals of a (2 s, twice its expiry)", deadline_s=60)
    assert client.get("lease-test:a") == b"me"  # only the renewals kept it
    thread = lease._thread
    lease.hold("lease-test:b", "me", 1.0)  # the process's next task
    assert lease._thread is thread
    moved_on = len(renewals)
    poll(lambda: renewed("lease-test:b", 8, moved_on), "8 renewals of b", deadline_s=60)
    assert "lease-test:a" not in renewals[moved_on + 1 :]  # a is left alone (one renewal may have been in flight)
    poll(lambda: client.get("lease-test:a") is None, "a expiring once no longer renewed", deadline_s=60)
    assert client.get("lease-test:b") == b"me"
    lease.release()
    released = len(renewals)
    poll(lambda: client.get("lease-test:b") is None, "b expiring once released", deadline_s=60)
    assert renewals[released + 1 :].count("lease-test:b") == 0 and thread.is_alive()


def test_queued_tasks_are_not_late(farm):
    """Six short tasks (10 env steps) wait in the queue behind two long ones of another run that
    hold both pool processes for 12 s or more: three times their task_timeout of 4 s, which once made
    them 'late' and re-sent. Now only time since a task started counts, so none is re-sent. (With a
    2 s timeout, a short task's first run in a pool process starved by a loaded CI machine once
    took longer than that from its start.)"""
    from rlfarm.farm.connection import connect
    from rlfarm.trainer.channel import FarmLink

    from .conftest import make_run, running_tasks, task_channel

    make_run(farm.redis_url, "blocker", ["env.id=tests.tiny_envs:slow", "env.num_envs=1"])
    make_run(farm.redis_url, "queued", ["env.id=tests.tiny_envs:slow", "env.num_envs=1"])
    blocker = task_channel(farm.redis_url, "blocker", timeout=600.0)
    blocker.submit_many(
        [{"iteration": 0, "index": i, "version": 0, "steps": 6000, "seed": 1} for i in range(2)]
    )  # SlowEnv busy-waits 2 ms a step: 12 s at the least
    app = make_app(farm.redis_url)
    poll(lambda: len(running_tasks(app, "blocker")) == 2, "both blocking tasks running")
    d = FarmLink(make_app(farm.redis_url), connect(farm.redis_url), "queued", task_timeout=4.0, max_redispatch=3).open()
    specs = [{"iteration": 0, "index": i, "version": 0, "steps": 10, "seed": 1} for i in range(6)]
    sent = time.monotonic()
    results = d.gather_group(specs)
    waited = time.monotonic() - sent
    assert waited > 2 * d.watchdog.task_timeout  # the premise: they sat in the queue well past task_timeout
    assert [r.index for r in results] == list(range(6))
    assert d.stats.redispatched == 0 and d.stats.dispatched == 6
    assert all(blocker.next_result(timeout=60) is not None for _ in range(2))  # the blockers end too


def test_chaos_a_minute_of_kills_and_a_redis_restart(tmp_path):
    """An ASYNC run of about a minute on both kinds of worker, during which a random pool process is
    SIGKILLed every 6 s and the redis-server is restarted once (SIGTERM, 2 s down, restarted from its
    append-only file): the run finishes and every env step counted comes from exactly one accepted
    result. (It ran two minutes with a kill every 10 s until the suite had to fit 20 minutes: as many
    kills, half the CPU. Throughput against a fault-free run: benchmarks/chaos.py.)"""
    import random

    farm = Farm(tmp_path)
    rng = random.Random(0)
    run_id = "chaos"
    kills = 0
    try:
        proc = farm.train(run_id, *SLOW_DQN, "--total-steps", "40000", "--set", "farm.lease_seconds=3")
        wait_for_rows(proc, tmp_path / run_id)
        started = time.monotonic()
        restarted = False
        while proc.poll() is None and time.monotonic() - started < 90:
            time.sleep(6)  # the fault schedule: one kill every 6 s
            if not restarted and time.monotonic() - started > 20:
                farm.cluster.stop_redis(signal.SIGTERM)
                time.sleep(2)  # the outage
                farm.cluster.start_redis(same_port=True)
                restarted = True
                continue
            try:
                victim = rng.choice(sorted(_pool_pids(farm.url)))
            except (IndexError, redis.ConnectionError, OperationalError):
                continue  # no answer this round (a pool restarting): try at the next one
            os.kill(victim, signal.SIGKILL)
            kills += 1
        _, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stderr[-3000:]
        assert restarted and kills >= 5, (restarted, kills)
        s = read_summary(tmp_path / run_id)
        print(
            f"chaos: {kills} kills, {s['faults']}, {s['env_steps']} env steps in {s['wall_seconds']:.0f} s, "
            f"redispatched {s['redispatched']}, duplicates {s['duplicates']}"
        )
        assert s["env_steps"] >= 40000
        assert s["faults"]["redis_outages"] >= 1
        assert_nothing_lost_or_double_counted(s, 250)
        assert farm.workers_alive()
    finally:
        farm.stop()


def test_a_worker_process_killed_mid_stream_loses_no_game_and_nothing_is_double_counted(tmp_path):
    """farm.episodes = "continue" with 1,000-step episodes in 64-step tasks: SIGKILL the pool process
    running a task of the run. Its task is delivered again and goes on from the snapshot the stream's
    last task saved, in another process: no stream is restarted, no game lost, and the run finishes
    with every reported episode whole and every env step counted once."""
    from .test_streams import LONG, assert_whole_episodes

    farm = Farm(tmp_path)
    run_id = "streams-killed"
    try:
        proc = farm.train(
            run_id,
            *LONG,
            "--env",
            "tests.tiny_envs:long_slow",
            "--set",
            "farm.episodes=continue",
            "--total-steps",
            "10240",
            "--set",
            "farm.lease_seconds=3",
        )
        wait_for_rows(proc, tmp_path / run_id, rows=3)
        app = make_app(farm.url)

        def running_pid() -> int | None:  # a pool process in the middle of one of the run's tasks
            active = app.control.inspect(timeout=0.5).active() or {}
            return next(
                (t["worker_pid"] for tasks in active.values() for t in tasks if t["kwargs"].get("run") == run_id), None
            )

        victim = poll(running_pid, "a pool process running a task of the run", proc)
        app.close()
        os.kill(victim, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        s = read_summary(tmp_path / run_id)
        assert s["env_steps"] >= 10240
        assert not pid_alive(victim)  # (Celery re-delivers its unacked task: acks_late)
        assert_nothing_lost_or_double_counted(s, 2 * 64)
        # the run's 2 streams x 2 sub-envs, whichever processes ran them
        assert len(assert_whole_episodes(tmp_path / run_id, streams=4)) >= 4
        assert s["streams"]["restarted"] == 0 and s["streams"]["moved"] >= 1
        assert farm.workers_alive()
    finally:
        farm.stop()

"""`rlfarm status` against real Redis and Celery workers: JSON, tables, --watch, a live training run."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import termios
import time

import jsonschema
import pytest
from rich.console import Console

from rlfarm.commands.status import (
    SCHEMA_FILE,
    MemoryStatus,
    RunStatus,
    Share,
    Snapshot,
    parse_heartbeat,
    parse_workers,
    render,
    to_json,
)
from rlfarm.core.protocol import TASK_QUEUE
from rlfarm.farm import keys
from rlfarm.farm.connection import connect
from rlfarm.farm.runs import write_status
from rlfarm.local.cluster import LocalCluster

from .conftest import (
    WORKER_ENV,
    error_line,
    make_run,
    pid_alive,
    poll,
    rlfarm_cmd,
    run_cli,
    start_command,
    usage_error_line,
)


def status_json(url: str) -> dict:
    """`rlfarm status --json`, checked against its schema (rlfarm/commands/status.schema.json)."""
    result = run_cli("status", "--json", "--redis", url)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    jsonschema.validate(snapshot, json.loads(SCHEMA_FILE.read_text()))
    return snapshot


def run_entry(snapshot: dict, run_id: str) -> dict:
    [entry] = [r for r in snapshot["runs"] if r["run_id"] == run_id]
    return entry


HEARTBEAT = {
    "state": "running",
    "mode": "sync",
    "algo": "ppo",
    "env": "CartPole-v1",
    "env_steps": 12288,
    "total_steps": 100000,
    "version": 3,
    "sps": "9876.5",
    "tasks_in_flight": 2,
    "eval_mean_return": "327.40",
    "host": "trainer-host",
    "pid": 4242,
}


# ---- pure parts ----------------------------------------------------------------------------------
def test_parsing_and_rendering_without_io():
    hb = parse_heartbeat(
        {"state": "running", "env_steps": "10", "eval_mean_return": "nan", "sps": "oops", "updated": "100.0"}, now=103.5
    )
    assert (hb.state, hb.env_steps, hb.eval_mean_return, hb.sps, hb.age_s) == ("running", 10, None, None, 3.5)
    assert parse_heartbeat({}, now=0) is None
    assert parse_heartbeat({"state": "running", "slots_waiting": "0.125"}, now=0).slots_waiting == 0.125
    workers = parse_workers(
        {
            "b@h": {
                "pool": {"max-concurrency": 3, "processes": [7, 8, 9]},
                "total": {"rlfarm.rollout": 5, "rlfarm.eval": 2},
            },
            "a@h": {"pool": {"max-concurrency": 4}},
        }
    )
    assert [(w.name, w.processes, w.pids, w.tasks_done) for w in workers] == [
        ("a@h", 4, [], 0),
        ("b@h", 3, [7, 8, 9], 7),
    ]
    assert parse_workers(None) == []

    empty = Snapshot(
        redis="redis://:***@h:1/0",
        taken=0.0,
        queue_depth=4,
        memory=MemoryStatus(2048, "2.00K", 1 << 20, "1.00M", "allkeys-lru"),
        workers=[],
        runs=[],
        source="the rlfarm up farm",
    )
    console = Console(record=True, width=120)
    console.print(render(empty))
    text = console.export_text()
    assert text.splitlines()[0] == "farm: the rlfarm up farm, redis://:***@h:1/0"  # which farm it looked at
    for expected in (
        "no worker answered",
        "no runs in this Redis",
        "4 task messages waiting",
        "2.00K of 1.00M (0.2 %)",
        "allkeys-lru",
    ):
        assert expected in text
    data = json.loads(to_json(empty))
    assert data["processes"] == 0 and data["farm"]["source"] == "the rlfarm up farm" and "source" not in data
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))


def test_a_run_of_several_policies_shows_each_ones_last_evaluation():
    raw = {**HEARTBEAT, "policy_evals": json.dumps({"adversary": -12.345, "agent": 4.5})}
    hb = parse_heartbeat({k: str(v) for k, v in raw.items()}, now=0)
    assert hb.policy_evals == {"adversary": -12.345, "agent": 4.5}
    assert parse_heartbeat({"state": "running", "policy_evals": "[1, 2]"}, now=0).policy_evals is None
    snapshot = Snapshot(
        redis="redis://h:1/0",
        taken=0.0,
        queue_depth=0,
        memory=MemoryStatus(2048, "2.00K", 0, "0", "noeviction"),
        workers=[],
        runs=[RunStatus(run_id="tag", heartbeat=hb)],
    )
    console = Console(record=True, width=120)
    console.print(render(snapshot))
    text = console.export_text()
    assert "adversary -12.3" in text and "agent 4.5" in text and "327.4" not in text
    data = json.loads(to_json(snapshot))
    assert data["runs"][0]["heartbeat"]["policy_evals"] == {"adversary": -12.345, "agent": 4.5}
    jsonschema.validate(data, json.loads(SCHEMA_FILE.read_text()))


def test_a_run_that_ended_says_how_and_one_whose_trainer_vanished_says_so():
    def snapshot(*runs):
        return Snapshot(
            redis="redis://h:1/0",
            taken=0.0,
            queue_depth=0,
            memory=MemoryStatus(0, "0B", 0, "0B", "noeviction"),
            workers=[],
            runs=list(runs),
            source="--redis",
        )

    ended = [
        RunStatus(run_id=f"run-{state}", heartbeat=parse_heartbeat({**HEARTBEAT, "state": state}, now=0))
        for state in ("finished", "failed", "stopped")
    ]
    console = Console(record=True, width=160)
    console.print(render(snapshot(*ended, RunStatus(run_id="run-vanished"))))
    text = console.export_text()
    for state in ("finished", "failed", "stopped"):
        assert f"run-{state}" in text and state in text.split(f"run-{state}")[1].split("run-")[0]
    assert "no trainer heartbeat" in text.split("run-vanished")[1] and "killed?" in text


def test_the_tables_fit_80_columns_with_their_values_whole():
    """rich shrank every column to fit (`runni…`, `celery@worker…`): now the least needed columns are
    left out instead, and what is shown is whole."""
    workers = parse_workers(
        {
            "celery@worker-host-1": {
                "pool": {"processes": [7123, 8123, 9123]},
                "total": {"rlfarm.rollout": 5},
                "rlfarm": {"protocol": 1, "version": "0.1.0"},
            }
        }
    )
    live = parse_heartbeat({**HEARTBEAT, "slots_waiting": "0.25", "updated": "90"}, now=100)
    ended = parse_heartbeat(
        {**HEARTBEAT, "state": "finished", "env_steps": 1_000_000, "total_steps": 1_000_000, "updated": "10"}, now=5000
    )
    runs = [
        RunStatus(
            "cartpole-v1-20261126-205851-be6a",
            "ppo",
            "sync",
            "CartPole-v1",
            123,
            0.0,
            12.5,
            live,
            Share(1.0, 4, 3, 0.5, 6),
        ),
        RunStatus("halfcheetah-v4-20261126-205851-be6a", "sac", "async", "HalfCheetah-v4", 5, 0.0, 4000, ended),
        RunStatus("run-vanished"),
    ]
    snap = Snapshot(
        redis="redis://:***@127.0.0.1:6379/0",
        taken=0.0,
        queue_depth=4,
        memory=MemoryStatus(2048, "2.00K", 1 << 20, "1.00M", "allkeys-lru"),
        workers=workers,
        runs=runs,
        source="the rlfarm up farm",
    )
    whole = [
        "cartpole-v1-20261126-205851-be6a",
        "halfcheetah-v4-20261126-205851-be6a",
        "run-vanished",
        "running",
        "finished",
        "12.2k/100k",
        "1M/1M",
        "327.4",
        "no trainer heartbeat (killed?)",
        "celery@worker-host-1",
        "9.87k SPS",
        "10s ago",
    ]
    for width in (80, 200):
        console = Console(record=True, width=width)
        console.print(render(snap))
        text = console.export_text()
        assert "…" not in text and max(len(line.rstrip()) for line in text.splitlines()) <= width, text
        for expected in whole:
            assert expected in text, (width, expected, text)
    for expected in (
        "trainer-host",
        "pid 4242",
        "weight 1, cap 3 of 6",
        "50% of slots (1 min)",
        "25% idle",
        "v123",
        "7123 8123 9123",
        "0.1.0, protocol 1",
    ):
        assert expected in text, expected  # at 200 columns every column is there


# ---- against the farm fixture ----------------------------------------------------------------------
@pytest.mark.farm
def test_json_and_table_report_runs_heartbeat_workers_queue_memory(farm):
    make_run(farm.redis_url, "status-live-hb", versions=3)
    make_run(farm.redis_url, "status-no-hb")
    write_status(connect(farm.redis_url), "status-live-hb", {**HEARTBEAT, "updated": f"{time.time():.3f}"})

    snap = status_json(farm.redis_url)
    assert snap["redis"] == farm.redis_url and snap["farm"]["source"] == "--redis"
    live = run_entry(snap, "status-live-hb")
    assert (live["latest_version"], live["algo"], live["mode"], live["env"]) == (2, "ppo", "sync", "CartPole-v1")
    assert 0 <= live["policy_age_s"] < 3600 and live["policy_created"] <= snap["taken"]
    hb = live["heartbeat"]
    assert {k: hb[k] for k in HEARTBEAT} == {**HEARTBEAT, "sps": 9876.5, "eval_mean_return": 327.4}
    assert 0 <= hb["age_s"] < 3600
    assert run_entry(snap, "status-no-hb")["heartbeat"] is None
    assert run_entry(snap, "status-no-hb")["latest_version"] == 0

    assert len(snap["workers"]) >= 1 and snap["processes"] >= 2
    for worker in snap["workers"]:
        assert worker["processes"] == len(worker["pids"]) >= 1
        assert all(pid_alive(pid) for pid in worker["pids"])
    assert snap["queue_depth"] == connect(farm.redis_url).llen(TASK_QUEUE)
    assert snap["memory"]["used_bytes"] > 0 and snap["memory"]["used_human"].endswith(("K", "M", "G"))
    assert snap["memory"]["policy"] == "noeviction"

    # A wide terminal: every column (the 80-column table drops host, share and the like; tested below).
    table = run_cli("status", "--redis", farm.redis_url, env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    out = table.stdout
    assert out.splitlines()[0] == f"farm: --redis, {farm.redis_url}"
    for expected in (
        "status-live-hb",
        "status-no-hb",
        "no trainer heartbeat",
        "running",
        "12.2k/100k",
        "9.87k SPS",
        "327.4",
        "trainer-host",
        "pid 4242",
        "worker(s) online",
        "task messages waiting",
        "Redis memory",
    ):
        assert expected in out, expected


@pytest.mark.farm
def test_a_run_that_failed_says_failed_for_good(farm, tmp_path):
    """A finished and a crashed run both showed "no trainer heartbeat": the trainer's last word is kept
    without expiry (a finished one: test_status_follows_a_live_training_run)."""
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "status-crashed",
        "--logdir",
        str(tmp_path),
        "--env",
        "tests.tiny_envs:crashing",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.num_tasks=1",
        "--set",
        "farm.steps_per_env=64",
        "--set",
        "ppo.num_minibatches=1",
        "--total-steps",
        "128",
    )
    assert result.returncode == 1 and "the simulator crashed" in error_line(result), result.stderr[-3000:]
    hb = run_entry(status_json(farm.redis_url), "status-crashed")["heartbeat"]
    assert hb is not None and hb["state"] == "failed"
    assert connect(farm.redis_url).ttl(keys.status("status-crashed")) == -1  # kept: it never expires
    table = run_cli("status", "--redis", farm.redis_url, env={"COLUMNS": "80"}).stdout
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if "status-crashed" in line)
    row = lines[start : next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].strip())]
    assert "failed" in row[0] and "no trainer heartbeat" not in "\n".join(row), table


def read_until_frames(read, frames: int) -> bytes:
    """Read the output of `status --watch` until `frames` headers have appeared (or it ends)."""
    seen = b""
    while seen.count(b"rlfarm status") < frames:
        chunk = read()
        if not chunk:
            break
        seen += chunk
    return seen


@pytest.mark.farm
@pytest.mark.parametrize("output", ["pipe", "tty"])
def test_watch_refreshes_until_ctrl_c(farm, output):
    make_run(farm.redis_url, f"status-watch-{output}")
    cmd = rlfarm_cmd("status", "--watch", "--interval", "0.2", "--redis", farm.redis_url)
    env = {**os.environ, **WORKER_ENV}
    if output == "pipe":
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        read = lambda: proc.stdout.read1(65536)  # noqa: E731
    else:  # a terminal: rich Live redraws the frame in place
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 140, 0, 0))
        proc = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
        os.close(slave)

        def read() -> bytes:
            try:
                return os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed
                return b""

    try:
        seen = read_until_frames(read, 2)
        assert proc.poll() is None, proc.stderr.read().decode()
        assert seen.count(b"rlfarm status") >= 2 and f"status-watch-{output}".encode() in seen
        # A terminal gets frames redrawn in place (cursor-up codes); a pipe gets plain frames.
        assert (b"\x1b[1A" in seen) == (output == "tty")
        proc.send_signal(signal.SIGINT)
        while read():  # drain, so the last redraw cannot block on a full pipe
            pass
        assert proc.wait() == 0
        stderr = proc.stderr.read().decode()
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if output == "tty":
            os.close(master)


# ---- own Redis: errors, passwords, a live training run -----------------------------------------------
@pytest.mark.process
def test_unreachable_redis_and_bad_interval_are_one_clear_line():
    unreachable = run_cli("status", "--redis", "redis://:hunter2@127.0.0.1:1/0")
    assert unreachable.returncode == 1, unreachable.stderr  # as `train` and `worker` exit on it
    line = error_line(unreachable)
    assert "cannot reach Redis at redis://:***@127.0.0.1:1/0" in line and "hunter2" not in line
    for command in (["train", "--total-steps", "4096"], ["worker"]):  # the same line, the same status
        other = run_cli(*command, "--redis", "redis://:hunter2@127.0.0.1:1/0")
        assert other.returncode == 1 and "cannot reach Redis at" in error_line(other), other.stderr
    line = usage_error_line(run_cli("status", "--watch", "--interval", "0", "--redis", "redis://127.0.0.1:1/0"))
    assert "--interval must be a positive number" in line


@pytest.mark.farm
def test_password_is_never_shown(tmp_path):
    with LocalCluster(workers=0, name="rlfarm-test-status-pw", log_dir=tmp_path) as cluster:
        connect(cluster.redis_url).config_set("maxmemory", "64mb")
        make_run(cluster.redis_url, "status-pw")
        connect(cluster.redis_url).config_set("requirepass", "s3cret-pw")
        url = f"redis://:s3cret-pw@127.0.0.1:{cluster.port}/0"

        snap = status_json(url)
        assert snap["redis"] == f"redis://:***@127.0.0.1:{cluster.port}/0"
        assert snap["memory"]["max_bytes"] == 64 << 20 and snap["workers"] == []
        table = run_cli("status", "--redis", url)
        assert table.returncode == 0, table.stderr
        assert "status-pw" in table.stdout and "of 64.00M" in table.stdout
        assert "no worker answered" in table.stdout
        assert "s3cret-pw" not in table.stdout + table.stderr

        wrong = run_cli("status", "--redis", f"redis://:wrong-pw@127.0.0.1:{cluster.port}/0")
        line = usage_error_line(wrong)
        assert "refused the credentials" in line and "wrong-pw" not in wrong.stderr


@pytest.mark.farm
def test_status_follows_a_live_training_run(tmp_path):
    """The trainer starts with no worker online, so its tasks wait in the queue: status sees a running
    heartbeat and the queued tasks, deterministically. A worker then joins and the run finishes."""
    with LocalCluster(workers=0, name="rlfarm-test-status-live", log_dir=tmp_path, extra_env=WORKER_ENV) as cluster:
        url = cluster.redis_url
        train = start_command(
            "train",
            "--redis",
            url,
            "--run-id",
            "status-train",
            "--total-steps",
            "8192",
            "--logdir",
            str(tmp_path / "runs"),
            env={**os.environ, **WORKER_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 600  # generous: only a broken trainer gets near it
            while True:
                assert train.poll() is None, train.communicate()[1]
                snap = status_json(url)
                runs = {r["run_id"]: r for r in snap["runs"]}
                hb = runs.get("status-train", {}).get("heartbeat")
                if hb and snap["queue_depth"] == 2:  # cartpole-ppo: 2 tasks per iteration
                    break
                assert time.monotonic() < deadline, snap
            assert (hb["state"], hb["env_steps"], hb["total_steps"], hb["algo"]) == ("running", 0, 8192, "ppo")
            assert hb["pid"] == train.pid and runs["status-train"]["latest_version"] == 0
            assert snap["workers"] == []

            cluster.add_worker(1)
            _, stderr = train.communicate()
            assert train.returncode == 0, stderr
        finally:
            if train.poll() is None:
                train.send_signal(signal.SIGINT)
                train.wait()

        snap = status_json(url)
        hb = run_entry(snap, "status-train")["heartbeat"]
        assert (hb["state"], hb["env_steps"], hb["version"]) == ("finished", 8192, 2)
        assert run_entry(snap, "status-train")["latest_version"] == 2
        assert snap["queue_depth"] == 0
        assert [w["processes"] for w in snap["workers"]] == [1]


def test_runs_with_a_live_trainer_then_the_newest_come_first():
    from rlfarm.commands.status import RunStatus, most_recent_first

    def run(name, created, state=None, updated=None):
        hb = parse_heartbeat({"state": state, "updated": str(updated)}, now=2000.0) if state else None
        return RunStatus(
            run_id=name,
            algo="ppo",
            mode="sync",
            env="CartPole-v1",
            latest_version=1,
            policy_created=created,
            policy_age_s=None,
            heartbeat=hb,
        )

    runs = [
        run("old", 100.0),
        run("never-published", None),
        run("live", 50.0, "running", 1990.0),
        run("finished", 500.0, "finished", 600.0),
        run("new", 900.0),
    ]
    assert [r.run_id for r in most_recent_first(runs)] == ["live", "new", "finished", "old", "never-published"]


def test_the_broadcast_expects_the_registered_workers_only():
    """`rlfarm status` ends its broadcast once the workers of the farm's registry answered: their names,
    with what no worker wrote left out (rlfarm.farm.shares.live_nodes)."""
    from rlfarm.farm.shares import live_nodes

    class Registry:
        def zrangebyscore(self, key, low, high):
            return [b"2@rlfarm-7@host-a", b"1@celery@host-b", b"2@rlfarm-7@host-a", b"5", b"x@y", b"0@z@h"]

    assert live_nodes(Registry(), now=0.0) == ["celery@host-b", "rlfarm-7@host-a"]


@pytest.mark.farm  # the embedded default: its own redis-server and workers
def test_status_finds_a_run_training_on_its_embedded_default(tmp_path):
    """`rlfarm status` with no farm named, while a run trains on its embedded default, said "no farm
    found" (issue 51: the user copied redis_url out of cluster.json). Now it finds that run's Redis."""
    home = tmp_path / "home"
    env = {**os.environ, **WORKER_ENV, "RLFARM_HOME": str(home)}
    env.pop("RLFARM_REDIS_URL", None)
    run = "status-embedded"
    train = start_command(
        "train", "--run-id", run, "--logdir", str(tmp_path / "runs"), "--total-steps", "10000000",
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        progress = tmp_path / "runs" / run / "progress.csv"
        poll(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 2, "a logged iteration", train)
        result = run_cli("status", "--json", env=env)
        assert result.returncode == 0, result.stderr
        snap = json.loads(result.stdout)
        assert snap["farm"]["source"] == f"run {run}'s embedded Redis"
        assert run_entry(snap, run)["heartbeat"]["state"] == "running"
    finally:
        train.send_signal(signal.SIGINT)
        train.communicate(timeout=120)
    assert not list((home / "embedded").glob("*.json"))  # gone with its run
    gone = run_cli("status", "--json", env=env)
    assert gone.returncode == 1 and "no farm found" in gone.stderr

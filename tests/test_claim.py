"""One live trainer per run (rlfarm.farm.claim), done for real: two `rlfarm train` with one run id at once,
a second trainer on a run directory in use, a run id reused with other settings on the same workers,
and the queued tasks of a SIGKILLed trainer. Real redis-server, real `rlfarm worker`, the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import redis

from rlfarm.core.protocol import TASK_QUEUE
from rlfarm.farm import keys
from rlfarm.farm.claim import CLAIM_SECONDS
from rlfarm.local.cluster import LocalCluster

from .conftest import ROOT, WORKER_ENV, one_error_line, poll, read_summary, run_cli, start_command

pytestmark = [pytest.mark.farm, pytest.mark.fault]

RLFARM_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "INFO"]  # INFO: its skip notes
PPO = ["--preset", "cartpole-ppo", "--set", "eval.interval=0"]  # 2 tasks x 4 envs x 512 steps an iteration


@pytest.fixture
def store(tmp_path):
    """A redis-server of its own (no worker yet: each test starts its own when it wants one)."""
    cluster = LocalCluster(workers=0, name=f"rlfarm-claim-{os.getpid()}", log_dir=tmp_path, extra_env=WORKER_ENV)
    cluster.start()
    yield cluster
    cluster.stop()


def train(cluster: LocalCluster, run_id: str, logdir, *args: str) -> subprocess.Popen:
    """`rlfarm -q train` (-q: no start-up notes such as "no worker answered", errors only)."""
    return start_command(
        "-q",
        "train",
        "--redis",
        cluster.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(logdir),
        *args,
        env={**os.environ, **WORKER_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def holder(client: redis.Redis, run_id: str) -> dict | None:
    raw = client.get(keys.claim(run_id))
    return None if raw is None else json.loads(raw)


def test_the_same_run_id_started_twice_at_once_trains_once_and_the_other_is_one_line(store, tmp_path):
    client = redis.Redis.from_url(store.redis_url)
    # Both at once, different run directories, no worker yet: whoever claims the run first keeps it
    # (and cannot finish before a worker comes), the other must stop having touched nothing.
    a = train(store, "dup", tmp_path / "a", *PPO, "--total-steps", "8192")
    b = train(store, "dup", tmp_path / "b", *PPO, "--total-steps", "8192")
    loser = poll(lambda: next((p for p in (a, b) if p.poll() is not None), None), "one trainer to give up")
    winner = b if loser is a else a
    _, stderr = loser.communicate()
    assert loser.returncode == 1, stderr[-3000:]
    line = one_error_line(stderr, warnings=False)
    assert line.startswith("rlfarm: error: run 'dup' is in use by another trainer (host ")
    assert f"pid {winner.pid}, for " in line and "choose another --run-id" in line
    claim = holder(client, "dup")
    assert claim["pid"] == winner.pid
    meta = json.loads(client.get("rlfarm:dup:meta"))
    assert meta["incarnation"] == claim["incarnation"]  # the run's state is the winner's, whole
    assert client.smembers("rlfarm:dup:wanted") and client.llen(TASK_QUEUE) == 2  # its tasks, still wanted
    loser_dir = (tmp_path / "a" if loser is a else tmp_path / "b") / "dup"
    # Not a file, not a directory: its run directory and logdir (made for its lock) are gone again.
    assert not loser_dir.parent.exists(), sorted(loser_dir.parent.rglob("*"))

    # The same for its run directory: a second trainer resuming it (here on an embedded Redis of its
    # own, where no claim in the first Redis can stop it) is refused before it writes anything.
    winner_dir = (tmp_path / "b" if loser is a else tmp_path / "a") / "dup"
    poll(lambda: (winner_dir / "checkpoint.safetensors").exists(), "the winner's first checkpoint", winner)
    before = {p.name: p.stat().st_mtime_ns for p in winner_dir.iterdir()}
    second = run_cli("-q", "train", "--resume", "dup", "--logdir", str(winner_dir.parent), "--workers", "1")
    assert second.returncode == 1, second.stderr[-3000:]
    line = one_error_line(second.stderr)
    assert line == (
        f"rlfarm: error: run directory {winner_dir} is in use by another trainer (host "
        f"{claim['host']}, pid {winner.pid}" + line.split(f"pid {winner.pid}")[1]
    )
    assert "wait for it to end or stop it" in line
    assert {p.name: p.stat().st_mtime_ns for p in winner_dir.iterdir()} == before  # nothing written

    # The claim outlives its expiry while the trainer lives: its heartbeat renews it.
    poll(lambda: time.time() > claim["since"] + CLAIM_SECONDS + 1, "the claim's first expiry to pass")
    assert holder(client, "dup") == claim and winner.poll() is None
    store.add_worker(1, command=RLFARM_WORKER)
    out, err = winner.communicate(timeout=600)
    assert winner.returncode == 0, err[-3000:]
    assert read_summary(winner_dir)["env_steps"] == 8192
    assert client.get(keys.claim("dup")) is None  # released at exit: queued tasks of it would be dropped


def test_a_reused_run_id_with_other_settings_is_a_new_run_to_every_worker(store, tmp_path):
    """One pool process, so the second run meets the very process that cached the first."""
    store.add_worker(1, command=RLFARM_WORKER)
    first = run_cli(
        "train",
        "--redis",
        store.redis_url,
        "--run-id",
        "reuse",
        "--logdir",
        str(tmp_path),
        *PPO,
        "--total-steps",
        "8192",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert read_summary(tmp_path / "reuse")["env_steps"] == 8192
    deleted = run_cli("checkpoints", "delete", "reuse", "--redis", store.redis_url)
    assert deleted.returncode == 0, deleted.stderr
    shutil.rmtree(tmp_path / "reuse")
    second = run_cli(
        "train",
        "--redis",
        store.redis_url,
        "--run-id",
        "reuse",
        "--logdir",
        str(tmp_path),
        *PPO,
        "--set",
        "env.num_envs=8",
        "--total-steps",
        "16384",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "run reuse: 16384 env steps" in second.stdout  # 8 envs per task, not the cached 4
    summary = read_summary(tmp_path / "reuse")
    assert summary["env_steps"] == 16384 and summary["unique_task_ids_accepted"] == 4  # 2 iterations x 2 tasks


def test_the_queued_tasks_of_a_sigkilled_trainer_are_dropped_unrun(store, tmp_path):
    client = redis.Redis.from_url(store.redis_url)
    proc = train(store, "dead", tmp_path, *PPO, "--set", "farm.num_tasks=4")
    poll(lambda: client.llen(TASK_QUEUE) >= 4, "the trainer's 4 tasks to be queued", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert client.sismember("rlfarm:dead:wanted", "rollout:0:0")  # nobody cleaned up after it
    poll(
        lambda: client.get(keys.claim("dead")) is None,
        "the dead trainer's claim to expire",
        deadline_s=CLAIM_SECONDS * 4,
    )
    store.add_worker(1, command=RLFARM_WORKER)
    log = tmp_path / "worker-0.log"
    poll(
        lambda: log.read_text().count("of run dead: the run has no live trainer") == 4,
        "the worker to drop the 4 queued tasks",
    )
    assert client.llen(TASK_QUEUE) == 0
    assert client.llen("rlfarm:dead:results") == 0  # none ran: nothing pushed
    assert not client.keys("rlfarm:dead:lease:*")


def test_a_refused_trainer_leaves_no_file_it_created(tmp_path):
    """RunDirLock: a trainer refused before it wrote anything (the run claimed in Redis by another)
    removes its lock file and the directories it made; one refused on a locked directory creates
    nothing; a directory with anything else in it, or a lock file it did not create, is kept."""
    from rlfarm.errors import RunInUse
    from rlfarm.farm.claim import RunDirLock

    run_dir = tmp_path / "logs" / "run"
    refused_later = RunDirLock(run_dir)
    refused_later.acquire()
    assert (run_dir / "trainer.lock").exists()
    refused_later.release()  # RunInUse from the claim: nothing else was written
    assert not (tmp_path / "logs").exists()

    holder = RunDirLock(run_dir)
    holder.acquire()
    with pytest.raises(RunInUse):
        RunDirLock(run_dir).acquire()
    assert sorted(p.name for p in run_dir.iterdir()) == ["trainer.lock"]  # the holder's, untouched
    (run_dir / "config.json").write_text("{}")  # the holder trains
    holder.release()
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "trainer.lock"]

    (run_dir / "config.json").unlink()
    resumed = RunDirLock(run_dir)  # the lock file is an earlier trainer's: not this one's to remove
    resumed.acquire()
    resumed.release()
    assert (run_dir / "trainer.lock").exists()


def test_a_forged_claim_met_by_several_renewals_at_once_is_written_back_never_obeyed(store):
    """The claim is renewed by its own thread, the watchdog's and the main loop's. Forged (a value
    without the farm's signature) and then renewed by four threads at once, it must be refused and
    written back by one, and never read as another trainer's by the others (a clean-clone run saw
    the second of two refusals end the run as "taken over")."""
    import threading

    from rlfarm.farm.claim import Claim

    client = redis.Redis.from_url(store.redis_url)
    claim = Claim(client, "raced", secret="s" * 64)
    claim.acquire()
    forged = json.dumps({"incarnation": "0" * 16, "host": "elsewhere", "pid": 1, "since": 0})
    try:
        for _ in range(40):
            client.set(keys.claim("raced"), forged, px=15000)
            barrier, answers = threading.Barrier(4), []

            def renew(barrier=barrier, answers=answers):
                barrier.wait()
                answers.append(claim.renew())

            threads = [threading.Thread(target=renew) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert answers == [True] * 4 and claim.lost is None, (answers, claim.lost)
            assert client.get(keys.claim("raced")).decode() == claim.value
    finally:
        claim.release()

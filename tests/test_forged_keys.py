"""No single write by someone without the farm's secret ends a signed run, whatever the key.

For every key of the registry (rlfarm.farm.keys: the run's keys and the farm's), one write is done
for real against a running SYNC run on a farm with RLFARM_SECRET, by a client that can reach Redis
and holds no secret: a pointer set to a value the trainer did not write (`policy:latest` 9999, the
claim, a listing's member) or a key replaced by one of another type (which made the trainer's next
command on it fail with WRONGTYPE). The run must finish and end with the very policy bytes of the
same run untouched; where the trainer reads the key, the forgery is refused, counted
(`security/refused_key`) and said in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from rlfarm.farm import keys
from rlfarm.farm.connection import connect

from .conftest import WORKER_ENV, poll, read_summary, start_command

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = [pytest.mark.farm, pytest.mark.fault, pytest.mark.xdist_group("forged-keys")]

SECRET = "forged-keys-secret-0123456789abcdef"
ARGS = [
    "--env",
    "tests.tiny_envs:long_slow",
    "--total-steps",
    str(4 * 256 * 8),
    "--set",
    "farm.num_tasks=4",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=256",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "farm.lease_seconds=2",
    "--set",
    "eval.interval=4096",
    "--set",
    "eval.episodes=2",
    "--set",
    "eval.confirm_episodes=0",
]


def _claim(client, run):
    client.set(
        keys.claim(run), json.dumps({"incarnation": "0" * 16, "host": "elsewhere", "pid": 1, "since": 0}), px=15000
    )


def _leases(client, run):
    pipe = client.pipeline(transaction=False)
    for iteration in range(16):
        for index in range(4):
            pipe.rpush(keys.lease(run, keys.task("rollout", iteration, index)), "forged")
    pipe.execute(raise_on_error=False)  # a lease a worker holds now is a string: that one stays


# key -> (the forgery, whether the trainer itself reads the key: the forgery is then counted)
FORGERIES = {
    "policy:latest": (lambda c, run: c.set(keys.latest(run), 9999), True),
    "versions (member)": (lambda c, run: c.zadd(keys.versions(run), {"forged": 10**9}), True),
    "versions (type)": (lambda c, run: c.set(keys.versions(run), "forged"), True),
    "pinned": (lambda c, run: c.set(keys.pinned(run), "forged"), False),
    "trainer (claim)": (_claim, True),
    "status": (lambda c, run: c.set(keys.status(run), "forged"), True),
    "share": (lambda c, run: c.set(keys.share(run), "forged"), False),
    "wanted (type)": (lambda c, run: c.set(keys.wanted(run), "forged"), True),
    "wanted (emptied)": (lambda c, run: c.delete(keys.wanted(run)), False),
    "results": (lambda c, run: c.set(keys.results(run), "forged"), True),
    "meta": (lambda c, run: c.set(keys.meta(run), "forged"), False),
    "policy:<v>": (lambda c, run: c.set(keys.policy(run, int(c.get(keys.latest(run)))), b"forged"), False),
    "lease": (_leases, True),
    "@farm:runs": (lambda c, run: c.set(keys.RUNS, "forged"), False),
    "@farm:nodes": (lambda c, run: c.set(keys.NODES, "forged"), False),
}


@pytest.fixture(scope="module")
def signed_farm(tmp_path_factory):
    from rlfarm.local.cluster import LocalCluster

    env = {**WORKER_ENV, "RLFARM_SECRET": SECRET}
    with LocalCluster(
        workers=2, name="rlfarm-test-forged-keys", log_dir=tmp_path_factory.mktemp("forged-keys"), extra_env=env
    ) as cluster:
        yield cluster


def _train(url: str, logdir, run_id: str, *extra: str) -> subprocess.Popen:
    return start_command(
        "train",
        "--redis",
        url,
        "--logdir",
        str(logdir),
        "--run-id",
        run_id,
        *ARGS,
        *extra,
        env={**os.environ, **WORKER_ENV, "RLFARM_SECRET": SECRET},
        stdout=subprocess.DEVNULL,
        stderr=open(logdir / f"{run_id}.txt", "w"),
    )


@pytest.fixture(scope="module")
def untouched(signed_farm, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("untouched")
    proc = _train(signed_farm.redis_url, logdir, "untouched")
    assert proc.wait(timeout=900) == 0, (logdir / "untouched.txt").read_text()[-3000:]
    return read_summary(logdir / "untouched")


@pytest.mark.parametrize("key", list(FORGERIES))
def test_one_forged_write_of_any_key_leaves_a_signed_run_as_it_would_have_ended(signed_farm, untouched, tmp_path, key):
    forge, read_by_trainer = FORGERIES[key]
    url, run_id = signed_farm.redis_url, f"forged-{list(FORGERIES).index(key)}"
    client = connect(url)  # the attacker: reaches Redis, holds no secret
    proc = _train(url, tmp_path, run_id)
    log = tmp_path / f"{run_id}.txt"
    try:
        poll(lambda: int(client.get(keys.latest(run_id)) or -1) >= 2, "policy v2 of the run", proc, log)
        forge(client, run_id)
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert "Traceback" not in stderr and "rlfarm: error" not in stderr, stderr[-3000:]
    summary = read_summary(tmp_path / run_id)
    assert summary["env_steps"] == untouched["env_steps"]
    assert summary["policy_sha256"] == untouched["policy_sha256"]  # learned exactly what it would have
    if read_by_trainer:
        assert summary["security"]["refused_key"] >= 1, stderr[-3000:]
        assert any(line.startswith("rlfarm: warning: refused rlfarm:") for line in stderr.splitlines()), stderr


def test_a_forged_env_stream_snapshot_is_counted_under_security_and_its_stream_restarts(signed_farm, tmp_path):
    """farm.episodes = "continue" on a signed run: a snapshot's digest travels in signed specs, so a
    blob put under its key by someone without the secret is a forgery. It was counted only as a
    stream restart; now also as `security/refused_snapshot`, and the run goes on (issue 50)."""
    url, run_id = signed_farm.redis_url, "forged-snapshot"
    client = connect(url)
    log = tmp_path / f"{run_id}.txt"
    proc = _train(url, tmp_path, run_id, "--set", "farm.episodes=continue")
    try:
        poll(lambda: next(client.scan_iter(f"{keys.prefix(run_id)}stream:*"), None), "a stream snapshot", proc, log)
        # The trainer held still while every snapshot of the run is overwritten and the pool processes,
        # which hold the streams, are SIGKILLed: their replacements must read the snapshots back.
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            forged = sum(
                client.set(key, b"forged", xx=True) or 0 for key in client.scan_iter(f"{keys.prefix(run_id)}stream:*")
            )
            for worker in signed_farm.worker_procs:
                pool = subprocess.run(["ps", "-o", "pid=", "--ppid", str(worker.pid)], capture_output=True, text=True)
                for pid in map(int, pool.stdout.split()):
                    os.kill(pid, signal.SIGKILL)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert forged and "does not match its digest" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "rlfarm: error" not in stderr, stderr[-3000:]
    assert read_summary(tmp_path / run_id)["security"]["refused_snapshot"] >= 1

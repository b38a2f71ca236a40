"""A Redis set to evict keys under memory pressure (`maxmemory-policy allkeys-lru`, a common setting)
drops a run's metadata, policies, `wanted` set and kombu's bindings mid-run. The trainer and
`rlfarm worker` refuse it in one line before they write anything; `rlfarm status` warns and goes on."""

from __future__ import annotations

import pytest
import redis

from rlfarm.farm.connection import connect, eviction_policy
from rlfarm.local.cluster import LocalCluster, RedisSpec
from tests.conftest import one_error_line, run_cli

pytestmark = [pytest.mark.farm, pytest.mark.fault]

FIX = "CONFIG SET maxmemory-policy noeviction"


@pytest.fixture
def evicting_redis(tmp_path):
    with LocalCluster(
        workers=0,
        name="rlfarm-test-evicting",
        log_dir=tmp_path,
        redis=RedisSpec(
            args=(
                "--maxmemory",
                "64mb",
                "--maxmemory-policy",
                "allkeys-lru",
            )
        ),
    ) as cluster:
        yield cluster


def test_an_evicting_redis_is_refused_before_anything_starts(evicting_redis, tmp_path):
    url = evicting_redis.redis_url
    client = connect(url)
    assert eviction_policy(client) == "allkeys-lru"

    train = run_cli("train", "--redis", url, "--run-id", "evicts", "--logdir", str(tmp_path), "--total-steps", "4096")
    assert train.returncode == 1
    line = one_error_line(train.stderr)
    assert "maxmemory-policy allkeys-lru" in line and FIX in line
    assert not (tmp_path / "evicts").exists()  # no run directory
    assert client.dbsize() == 0  # nothing written: no run meta, no policy, no queue

    worker = run_cli("worker", "--redis", url, "-c", "1")
    assert worker.returncode == 1
    line = one_error_line(worker.stderr)
    assert "maxmemory-policy allkeys-lru" in line and FIX in line

    status = run_cli("status", "--redis", url)
    assert status.returncode == 0, status.stderr
    warnings = [x for x in status.stderr.splitlines() if x.startswith("rlfarm: warning:")]
    assert len(warnings) == 1 and "maxmemory-policy allkeys-lru" in warnings[0] and FIX in warnings[0]

    # The fix the line names is enough: every volatile-* policy evicts too (rlfarm's leases and
    # status keys expire), noeviction does not.
    client.config_set("maxmemory-policy", "volatile-lru")
    assert eviction_policy(client) == "volatile-lru"
    client.config_set("maxmemory-policy", "noeviction")
    assert eviction_policy(client) is None
    status = run_cli("status", "--redis", url)
    assert status.returncode == 0 and "warning" not in status.stderr


def test_a_redis_switched_to_evicting_mid_run_is_said_once(tmp_path):
    """`CONFIG SET maxmemory-policy allkeys-lru` while a run trains: checked at the start only, it went
    unnoticed; now the trainer says so in one warning (once, not at every heartbeat) and goes on."""
    import os
    import subprocess

    from rlfarm.farm import keys

    from .conftest import WORKER_ENV, poll, start_command

    with LocalCluster(
        workers=1,
        name="rlfarm-test-evicting-later",
        log_dir=tmp_path,
        extra_env=WORKER_ENV,
        redis=RedisSpec(
            args=(
                "--maxmemory",
                "256mb",
            )
        ),
    ) as cluster:
        client = connect(cluster.redis_url)
        log = tmp_path / "stderr.txt"
        with open(log, "w") as err:
            proc = start_command(
                "train",
                "--redis",
                cluster.redis_url,
                "--run-id",
                "later",
                "--logdir",
                str(tmp_path),
                "--env",
                "tests.tiny_envs:long_slow",
                "--total-steps",
                str(2 * 256 * 24),
                "--set",
                "farm.num_tasks=2",
                "--set",
                "env.num_envs=1",
                "--set",
                "farm.steps_per_env=256",
                env={**os.environ, **WORKER_ENV},
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            poll(lambda: int(client.get(keys.latest("later")) or -1) >= 1, "policy v1", proc, log)
            client.config_set("maxmemory-policy", "allkeys-lru")
            assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    warnings = [line for line in log.read_text().splitlines() if "now evicts keys" in line]
    assert len(warnings) == 1 and "maxmemory-policy allkeys-lru" in warnings[0] and FIX in warnings[0], log.read_text()[
        -3000:
    ]


@pytest.mark.farm
def test_a_port_taken_between_free_port_and_bind_is_given_up_for_another(monkeypatch, tmp_path):
    """Under a parallel test run (or any busy machine) the port free_port found can be taken before
    redis-server binds it: the cluster starts on another one instead of failing, and never mistakes
    the port's holder for its own server."""
    import socket

    import rlfarm.local.cluster as cluster

    holder = socket.socket()  # listens but never answers, as a busy foreign server would
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    ports = iter([taken])
    real = cluster.free_port
    monkeypatch.setattr(cluster, "free_port", lambda host="127.0.0.1": next(ports, None) or real(host))
    try:
        with cluster.LocalCluster(workers=0, name="rlfarm-test-port-taken", log_dir=tmp_path) as c:
            assert c.port != taken and c.redis_proc.poll() is None
            assert redis.Redis(port=c.port).ping()
    finally:
        holder.close()
    assert "Address already in use" in (tmp_path / "redis.log").read_text()

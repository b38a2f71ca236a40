"""A Redis set to evict keys under memory pressure (`maxmemory-policy allkeys-lru`, a common setting)
drops a run's metadata, policies, `wanted` set and kombu's bindings mid-run. The trainer and
`rlfarm worker` refuse it in one line before they write anything; `rlfarm status` warns and goes on."""

from __future__ import annotations

import pytest

from rlfarm.local.cluster import LocalCluster
from rlfarm.farm.connection import connect, eviction_policy
from tests.conftest import one_error_line, run_cli

pytestmark = [pytest.mark.farm, pytest.mark.fault]

FIX = "CONFIG SET maxmemory-policy noeviction"


@pytest.fixture
def evicting_redis(tmp_path):
    with LocalCluster(workers=0, name="rlfarm-test-evicting", log_dir=tmp_path,
                      redis_args=["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]) as cluster:
        yield cluster


def test_an_evicting_redis_is_refused_before_anything_starts(evicting_redis, tmp_path):
    url = evicting_redis.redis_url
    client = connect(url)
    assert eviction_policy(client) == "allkeys-lru"

    train = run_cli("train", "--redis", url, "--run-id", "evicts", "--logdir", str(tmp_path),
                    "--total-steps", "4096")
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

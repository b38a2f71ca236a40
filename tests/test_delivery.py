"""A result's delivery (rlfarm.farm.delivery) against a real redis-server: pushed with its snapshot,
lease, attempts and `wanted` entry in one step while the run's trainer lives; after the run ended
(its `wanted` set deleted by Channel.finish), nothing but the deletions, so a straggler that ends
late leaves no list behind; at maxmemory, refused before anything was deleted."""

from __future__ import annotations

import pytest
import redis

from rlfarm.farm import keys
from rlfarm.farm.connection import connect
from rlfarm.farm.delivery import deliver
from rlfarm.farm.outage import is_oom
from rlfarm.local.cluster import LocalCluster

pytestmark = pytest.mark.farm


@pytest.fixture
def run(redis_only, request):
    client = connect(redis_only.redis_url)
    run_id = f"delivery-{request.node.name}"
    yield client, run_id
    doomed = list(client.scan_iter(match=keys.run_pattern(run_id)))
    if doomed:
        client.delete(*doomed)
    client.close()


def _task_keys(client: redis.Redis, run_id: str) -> tuple[str, str, str]:
    """A task in flight: its `wanted` entry, lease and attempts counter."""
    task = keys.task("rollout", 3, 1)
    lease, attempts = keys.lease(run_id, task), keys.attempts(run_id, "task-id")
    client.set(lease, "w@test", ex=60)
    client.set(attempts, 1)
    return task, lease, attempts


def test_a_live_runs_result_is_pushed_with_its_snapshot_and_its_task_is_settled(run):
    client, run_id = run
    task, lease, attempts = _task_keys(client, run_id)
    client.sadd(keys.wanted(run_id), keys.LIVE, task, keys.task("rollout", 3, 2))
    snapshot = keys.stream(run_id, "ab" * 32)

    assert deliver(client, run_id, b"sealed", delete=(attempts, lease), done=task, stream_snapshot=(snapshot, b"state"))

    assert client.lrange(keys.results(run_id), 0, -1) == [b"sealed"]
    assert 0 < client.ttl(keys.results(run_id)) <= keys.RESULTS_TTL
    assert client.get(snapshot) == b"state"
    assert 0 < client.ttl(snapshot) <= keys.STREAM_TTL
    assert not client.exists(lease, attempts)
    assert client.smembers(keys.wanted(run_id)) == {keys.LIVE.encode(), keys.task("rollout", 3, 2).encode()}


def test_without_a_done_entry_wanted_is_left_as_it_is(run):
    client, run_id = run
    task, lease, attempts = _task_keys(client, run_id)
    client.sadd(keys.wanted(run_id), keys.LIVE, task)
    assert deliver(client, run_id, b"skipped", delete=(attempts,))
    assert client.llen(keys.results(run_id)) == 1
    assert client.exists(lease) and not client.exists(attempts)
    assert client.scard(keys.wanted(run_id)) == 2


def test_an_ended_runs_late_result_leaves_nothing_behind(run):
    """What a straggler's copy did once: its task began while the run lived, and its result, pushed
    after the trainer deleted the run's lists, stayed for an hour."""
    client, run_id = run
    task, lease, attempts = _task_keys(client, run_id)
    snapshot = keys.stream(run_id, "cd" * 32)

    assert not deliver(
        client, run_id, b"late", delete=(attempts, lease), done=task, stream_snapshot=(snapshot, b"state")
    )

    assert not client.exists(keys.results(run_id), snapshot, lease, attempts, keys.wanted(run_id))


def test_a_wanted_set_without_live_counts_as_ended(run):
    """Task keys alone are not a live trainer: only LIVE is (Outbox adds it with every dispatch)."""
    client, run_id = run
    task, lease, attempts = _task_keys(client, run_id)
    client.sadd(keys.wanted(run_id), task)
    assert not deliver(client, run_id, b"late", delete=(attempts, lease), done=task)
    assert not client.exists(keys.results(run_id))
    assert client.smembers(keys.wanted(run_id)) == {task.encode()}


def test_at_maxmemory_the_delivery_is_refused_before_anything_is_deleted(tmp_path):
    """noeviction at its limit: the script's first write fails, so the lease and attempts stay and the
    trainer's watchdog still sees the task (the worker says so in one line, rlfarm.worker.results)."""
    with LocalCluster(workers=0, name="rlfarm-test-delivery-oom", log_dir=tmp_path) as cluster:
        client = connect(cluster.redis_url)
        run_id = "delivery-oom"
        task, lease, attempts = _task_keys(client, run_id)
        client.sadd(keys.wanted(run_id), keys.LIVE, task)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        try:
            with pytest.raises(redis.ResponseError) as refused:
                deliver(client, run_id, b"x" * 1000, delete=(attempts, lease), done=task)
        finally:
            client.config_set("maxmemory", "0")
        assert is_oom(refused.value), refused.value
        assert client.exists(lease, attempts) == 2
        assert not client.exists(keys.results(run_id))
        assert client.sismember(keys.wanted(run_id), task)
        client.close()

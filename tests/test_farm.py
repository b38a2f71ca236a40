"""The farm itself: real redis-server, real Celery worker processes, real messages."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from rlfarm.core.rollout import Rollout, collect, task_seeds
from rlfarm.errors import RolloutError
from rlfarm.farm import keys
from rlfarm.farm.app import ROLLOUT_TASK, make_app
from rlfarm.farm.connection import connect
from rlfarm.trainer.channel import FarmLink

from .conftest import make_run, poll, running_tasks, task_channel, task_specs

pytestmark = pytest.mark.farm


def test_group_results_are_ordered_deterministic_and_match_in_process(farm):
    cfg, store = make_run(farm.redis_url, "group", ["env.num_envs=2"])
    d = task_channel(farm.redis_url, "group")
    results = d.gather_group(task_specs(0, 6, 64))
    assert [r.index for r in results] == list(range(6))
    assert all(r.version == 0 for r in results)
    # A task is a pure function of its spec: recompute index 4 in this process and compare.
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.envs import describe, make_vector_env

    state, _ = store.get(0)
    policy = ActorCritic(describe("CartPole-v1"), PolicyConfig())
    policy.load_state_dict(state)
    seeds, aseed = task_seeds(1, 0, 4, 2)
    local = collect(policy.actor_snapshot(), make_vector_env("CartPole-v1", 2), 64, seeds, aseed)
    remote = Rollout.from_dict(results[4].rollout)
    for k, v in local.to_dict().items():
        assert (v is None and getattr(remote, k) is None) or (v == getattr(remote, k)).all(), k
    # Policies are fetched once per process and version, then reused.
    assert sum(r.policy_fetched for r in results) <= 2
    # The worker says where each task's time went: the policy lookup and the collect make its duration.
    for r in results:
        assert set(r.timings) == {"checks", "policy", "collect"} and min(r.timings.values()) >= 0
        assert r.timings["policy"] + r.timings["collect"] == pytest.approx(r.duration)
    assert connect(farm.redis_url).llen(keys.results("group")) == 0  # consumed results are gone


def test_the_worker_main_process_never_loads_torch(farm):
    """The worker's main process imports every algorithm's actors before its pool forks, so pool
    processes share them, but not torch: MLP policies act without it (rlfarm.algos.acting), and a pool
    process acting a CNN imports it itself (tests/test_acting.py: a whole run's pool never does)."""
    app = make_app(farm.redis_url)
    try:
        stats = app.control.inspect(timeout=5.0).stats() or {}
    finally:
        app.close()
    assert stats, "no worker answered"
    for node in stats.values():
        assert node["pool"]["processes"]
        assert "libtorch_cpu" not in Path(f"/proc/{node['pid']}/maps").read_text()


def test_an_mlp_version_acts_from_its_tensors_and_cached_versions_keep_their_weights(redis_only):
    """A worker process builds an MLP version's actor from its tensors, no network, and it acts as the
    network the trainer published; the actors of versions cached beside it keep their own weights."""
    import numpy as np

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import describe
    from rlfarm.worker.handler import TaskHandler

    cfg, store = make_run(redis_only.redis_url, "reuse")
    state0, _ = store.get(0)
    store.publish(1, {k: v + 0.5 if v.is_floating_point() else v for k, v in state0.items()}, "ppo")
    worker = TaskHandler(redis_only.redis_url)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actor0, _, fetched = worker._actor_of("reuse", 0)
    values0 = actor0.value(obs).copy()
    actor1, _, fetched_again = worker._actor_of("reuse", 1)
    assert fetched and fetched_again and worker.versions.networks == {}
    fresh = ActorCritic(describe(cfg.env.id), cfg.policy)
    fresh.load_state_dict(store.get(1)[0])  # version 1 as a newly built network acts
    np.testing.assert_array_equal(actor1.value(obs), fresh.actor_snapshot().value(obs))
    assert not np.allclose(actor1.value(obs), values0)
    cached0, _, refetched = worker._actor_of("reuse", 0)
    assert not refetched and cached0 is actor0
    np.testing.assert_array_equal(cached0.value(obs), values0)


def test_new_cnn_versions_load_into_one_network_and_cached_versions_keep_their_weights(redis_only):
    """A CNN acts through torch: a worker process builds the run's network once and loads each new
    version into it (building it was most of a fetch); the actors of versions cached beside it are
    snapshots and keep acting with their own weights."""
    import numpy as np

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import describe
    from rlfarm.worker.handler import TaskHandler

    image = ["env.id=tests.tiny_envs:image", "policy.cnn_features=32"]
    cfg, store = make_run(redis_only.redis_url, "reuse-cnn", image)
    state0, _ = store.get(0)
    store.publish(1, {k: v + 0.5 if v.is_floating_point() else v for k, v in state0.items()}, "ppo")
    worker = TaskHandler(redis_only.redis_url)
    obs = np.random.default_rng(0).integers(0, 256, size=(5, 2, 16, 16), dtype=np.uint8)
    actor0, _, fetched = worker._actor_of("reuse-cnn", 0)
    network = worker.versions.networks["reuse-cnn"]
    values0 = actor0.value(obs).copy()
    actor1, _, fetched_again = worker._actor_of("reuse-cnn", 1)
    assert fetched and fetched_again and worker.versions.networks == {"reuse-cnn": network}
    fresh = ActorCritic(describe(cfg.env.id), cfg.policy)
    fresh.load_state_dict(store.get(1)[0])
    np.testing.assert_allclose(actor1.value(obs), fresh.actor_snapshot().value(obs), rtol=1e-5, atol=1e-6)
    assert not np.allclose(actor1.value(obs), values0)
    cached0, _, refetched = worker._actor_of("reuse-cnn", 0)
    assert not refetched and cached0 is actor0
    np.testing.assert_array_equal(cached0.value(obs), values0)


def test_a_group_is_listed_as_wanted_in_one_command_before_any_task_is_sent(redis_only):
    d = task_channel(redis_only.redis_url, "batch")
    sadds = []
    sadd = d.client.sadd
    d.client.sadd = lambda *args: sadds.append(args) or sadd(*args)
    assert d.submit_many(task_specs(0, 3, 8)) == [("rollout", 0, i) for i in range(3)]
    assert len(sadds) == 1 and set(sadds[0][1:]) == {keys.LIVE, "rollout:0:0", "rollout:0:1", "rollout:0:2"}
    assert d.in_flight == 3 and d.stats.dispatched == 3
    with pytest.raises(ValueError, match="already in flight"):
        d.submit_many(task_specs(0, 1, 8))
    with pytest.raises(ValueError, match="already in flight"):
        d.submit_many(task_specs(1, 1, 8) * 2)
    assert d.stats.dispatched == 3  # nothing of a refused group was sent
    connect(redis_only.redis_url).delete(d.outbox.queue)  # no worker will take them


def test_failed_task_reports_a_clear_error(farm):
    make_run(farm.redis_url, "missing")
    d = task_channel(farm.redis_url, "missing")
    with pytest.raises(RolloutError, match="no policy version 7"):
        d.gather_group(task_specs(0, 1, 8, version=7))
    _, store = make_run(farm.redis_url, "badenv")
    meta = store.run_meta()
    meta["config"]["env"]["id"] = "tests.tiny_envs:nonexistent"  # a worker that cannot make the env
    store.set_run_meta(meta)
    with pytest.raises(RolloutError, match="has no attribute 'nonexistent'"):
        task_channel(farm.redis_url, "badenv").gather_group(task_specs(0, 1, 8))


def test_pickle_message_is_refused(farm):
    make_run(farm.redis_url, "pickled")
    client = connect(farm.redis_url)
    evil = make_app(farm.redis_url)
    evil.conf.task_serializer = "pickle"
    evil.conf.accept_content = ["pickle", "json", "msgpack"]
    evil.send_task(
        ROLLOUT_TASK, kwargs={"run": "pickled", "iteration": 0, "index": 99, "version": 0, "steps": 8, "seed": 1}
    )
    # A msgpack task sent afterwards completes; the pickled one, ahead of it, produced nothing.
    good = task_channel(farm.redis_url, "pickled").gather_group(task_specs(1, 1, 8))
    assert good[0].index == 0
    assert client.llen(keys.results("pickled")) == 0
    logs = "".join(p.read_text(errors="replace") for p in Path(farm.log_dir).glob("worker-*.log"))
    assert "Refusing to deserialize untrusted content of type pickle" in logs


def test_sigkilled_worker_process_mid_iteration(farm):
    """A pool process dies mid-task: the iteration still completes with exactly one result per index."""
    make_run(farm.redis_url, "killed", ["env.id=tests.tiny_envs:slow", "env.num_envs=1"])
    d = task_channel(farm.redis_url, "killed", timeout=60.0)
    specs = task_specs(0, 4, 1500)  # 4 tasks of ~3 s on 2 processes: a kill lands mid-task
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("results", d.gather_group(specs)))
    thread.start()
    app = make_app(farm.redis_url)
    running = poll(lambda: running_tasks(app, "killed") or not thread.is_alive(), "a rollout task running")
    assert running is not True, "the iteration ended before a task was seen running"
    victim, task_id = running[0]
    os.kill(victim, signal.SIGKILL)
    thread.join()
    results = out["results"]
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert all(r.kind == "rollout" and r.rollout["rewards"].size == 1500 for r in results)
    # The killed task ran again elsewhere: delivered again (acks_late + reject_on_worker_lost), or, on
    # a loaded machine where its lease lapsed before the redelivered copy finished, sent again.
    rerun = [r for r in results if r.task_id == task_id]
    if rerun:
        assert len(rerun) == 1 and rerun[0].worker.split(":")[1] != str(victim)
    else:
        assert d.stats.leases_expired == 1, d.stats
    # Every result that arrived was either counted once or dropped as a duplicate, never both.
    assert d.stats.received == len(results) + d.stats.duplicates


def test_straggler_is_redispatched_and_late_copies_are_dropped(farm):
    """Tasks slower than the deadline are sent again; only the first copy of each index counts."""
    make_run(farm.redis_url, "straggle", ["env.id=tests.tiny_envs:slow", "env.num_envs=1"])
    d = FarmLink(
        make_app(farm.redis_url), connect(farm.redis_url), "straggle", task_timeout=0.4, max_redispatch=50
    ).open()
    results = d.gather_group(task_specs(0, 2, 500))  # >= 1 s each: well past the 0.4 s deadline
    assert [r.index for r in results] == [0, 1]
    assert d.stats.redispatched >= 2 and d.stats.dispatched == 2 + d.stats.redispatched
    # Drain every remaining copy: the next iteration's gather drops them as duplicates.
    d.watchdog.task_timeout = 60
    d.gather_group(task_specs(1, 1, 8))
    while d.stats.received < d.stats.dispatched:
        message = d.receive(timeout=30)
        assert message is not None, "a dispatched copy never reported back"
        d.stats.duplicates += 1
    assert d.stats.duplicates == d.stats.dispatched - 3  # 3 results counted: indexes 0, 1 and 0'
    assert all(len(ids) == len(set(ids)) for ids in d.stats.task_ids.values())

"""PolicyStore against a real redis-server."""

import pytest
import torch

from rlfarm.errors import PolicyCorrupt, PolicyNotFound, PolicyTrimmed, RunNotFound
from rlfarm.farm.connection import connect, redact
from rlfarm.farm.policies.store import PolicyStore
from rlfarm.farm.runs import list_runs
from rlfarm.worker.cache import PolicyCache

pytestmark = pytest.mark.farm


def _state(x: float):
    return {"layer.weight": torch.full((4, 3), x), "layer.bias": torch.arange(4.0)}


def test_round_trip_latest_and_versions(redis_only):
    store = PolicyStore(connect(redis_only.redis_url), "roundtrip", keep=3)
    assert store.latest() is None
    for v in range(5):
        store.publish(v, _state(float(v)), "ppo", {"env_steps": str(100 * v)})
    assert store.latest() == 4
    assert store.versions() == [2, 3, 4]  # keep=3 trims 0 and 1
    state, meta = store.get(3)
    assert torch.equal(state["layer.weight"], torch.full((4, 3), 3.0))
    assert meta["version"] == "3" and meta["algo"] == "ppo" and meta["env_steps"] == "300"
    assert {"created", "sha256"} <= set(meta)
    _, latest_meta = store.get("latest")
    assert latest_meta["version"] == "4"
    with pytest.raises(ValueError, match="not newer"):
        store.publish(4, _state(0.0), "ppo")


def test_missing_trimmed_and_corrupt_versions(redis_only):
    client = connect(redis_only.redis_url)
    store = PolicyStore(client, "errors", keep=2)
    with pytest.raises(PolicyNotFound, match="no published policy"):
        store.get("latest")
    for v in range(4):
        store.publish(v, _state(1.0), "ppo")
    with pytest.raises(PolicyTrimmed, match="version 1 was trimmed; retained versions are 2..3"):
        store.get(1)
    with pytest.raises(PolicyNotFound, match="no policy version 9"):
        store.get(9)
    blob = bytearray(client.get("rlfarm:errors:policy:3"))
    blob[-1] ^= 0x01
    client.set("rlfarm:errors:policy:3", bytes(blob))
    with pytest.raises(PolicyCorrupt, match="checksum mismatch"):
        store.get(3)
    with pytest.raises(RunNotFound):
        store.run_meta()


def test_a_version_pinned_by_two_holders_stays_until_both_let_go(redis_only):
    """Self-play's league and the evaluations pin versions independently: an evaluation that ends
    must not trim a league member a task may still fetch (a run failed on it: PolicyNotFound)."""
    store = PolicyStore(connect(redis_only.redis_url), "holders", keep=2)
    store.publish(0, _state(0.0), "ppo")
    store.pin(0, "league")
    store.pin(0)  # an evaluation of version 0
    for v in range(1, 4):
        store.publish(v, _state(float(v)), "ppo")
    store.unpin(0)  # the evaluation is done
    assert 0 in store.versions() and torch.equal(store.get(0)[0]["layer.weight"], torch.zeros(4, 3))
    store.unpin(0, "league")  # the version left the league: trimmed, as it is older than the 2 kept
    assert store.versions() == [2, 3]


def test_run_meta_listing_and_namespacing(redis_only):
    client = connect(redis_only.redis_url)
    a, b = PolicyStore(client, "run-a"), PolicyStore(client, "run-b")
    a.set_run_meta({"x": 1})
    b.set_run_meta({"x": 2})
    a.publish(0, _state(0.0), "ppo")
    assert b.latest() is None and a.run_meta() == {"x": 1}
    assert {"run-a", "run-b"} <= set(list_runs(client))
    assert all(k.decode().startswith("rlfarm:run-") for k in client.keys("rlfarm:run-*"))


def test_unreachable_redis_fails_fast_and_redacts():
    with pytest.raises(ConnectionError, match="cannot reach Redis at redis://:\\*\\*\\*@127.0.0.1:1/0"):
        connect("redis://:secret@127.0.0.1:1/0", timeout=2)
    assert redact("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"


def test_policy_cache_is_lru():
    cache = PolicyCache(size=2)
    cache.put(("r", 1), "one")
    cache.put(("r", 2), "two")
    assert cache.get(("r", 1)) == "one"
    cache.put(("r", 3), "three")  # evicts version 2, the least recently used
    assert cache.get(("r", 2)) is None and cache.get(("r", 1)) == "one" and len(cache) == 2


def test_latest_trimmed_between_its_pointer_and_its_blob_acts_with_the_newer_version(redis_only):
    """A fast publisher (async.publish_interval=1, 128 versions a result) moved past retention between a
    worker's read of the run's pointer and of the blob: the task failed with PolicyTrimmed and ended
    the run (a clean-clone CI of tests/test_async.py). "latest" reads the pointer again instead; a
    version named outright still fails."""
    from rlfarm.worker.policies import PolicyVersions

    from .conftest import make_run

    _, store = make_run(redis_only.redis_url, "trimmed-latest", ["farm.keep_versions=2"], versions=4)
    meta = store.run_meta()
    worker = PolicyVersions(store.client, None, lambda run: meta, {}, {"policy_fetches": 0, "policy_fetch_bytes": 0})
    reads = iter([1, 3])  # the first read is of a version trimmed since (retained: 2..3)
    real = worker.receiver.resolve
    worker.receiver.resolve = lambda run, version: next(reads) if version == "latest" else real(run, version)
    actor, version, fetched = worker.actor("trimmed-latest", "latest")
    assert version == 3 and fetched and actor is not None
    with pytest.raises(PolicyTrimmed):
        worker.actor("trimmed-latest", 1)

"""farm.episodes = "continue": a run's env streams go on across tasks, so episodes longer than a task
are learned from and reported, each once and whole, on real Redis and Celery workers, and a batch
holds the same distinct streams whatever the number of processes. (Pure stream mechanics and moved
streams: test_rollout.py, test_snapshot.py; a worker SIGKILLed mid-stream: test_faults.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import WORKER_ENV, make_run, read_csv, read_summary, run_cli, task_channel
from .tiny_envs import LongEnv

pytestmark = pytest.mark.farm

LONG = [
    "--preset",
    "cartpole-ppo",
    "--env",
    "tests.tiny_envs:long_episodes",
    "--set",
    "env.num_envs=2",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "farm.steps_per_env=64",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
]


def assert_whole_episodes(run_dir, streams: int) -> list[dict]:
    """Every reported episode is exactly one whole LongEnv episode, and no more were reported than the
    env steps can hold, nor fewer than they must (each stream leaves at most one episode unfinished)."""
    episodes = read_csv(run_dir / "episodes.csv")
    steps = read_summary(run_dir)["env_steps"]
    assert {float(e["episodic_return"]) for e in episodes} == {LongEnv.RETURN}
    assert {int(e["episodic_length"]) for e in episodes} == {LongEnv.LENGTH}
    assert steps // LongEnv.LENGTH >= len(episodes) >= (steps - streams * (LongEnv.LENGTH - 1)) / LongEnv.LENGTH
    return episodes


def test_episodes_longer_than_a_task_are_reported_once_whole_in_continue_mode(farm, tmp_path):
    """1,000-step episodes, 64-step tasks: each episode spans 16 tasks of its stream."""
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        *LONG,
        "--set",
        "farm.episodes=continue",
        "--total-steps",
        "12288",
        "--run-id",
        "continue",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # the farm fixture: 2 pool processes x 2 sub-envs
    episodes = assert_whole_episodes(tmp_path / "continue", streams=4)
    assert len(episodes) >= 9


def test_fresh_mode_never_reaches_the_end_of_an_episode_longer_than_a_task(farm, tmp_path):
    """The documented trade-off: "fresh" tasks restart their episodes, so a 64-step task never sees
    step 65 of a 1,000-step episode, and nothing is reported."""
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        *LONG,
        "--total-steps",
        "4096",
        "--run-id",
        "fresh",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_csv(tmp_path / "fresh" / "episodes.csv") == []
    assert read_summary(tmp_path / "fresh")["env_steps"] == 4096


def test_continue_mode_on_an_env_whose_state_cannot_be_saved_is_one_error_line(tmp_path):
    """Refused before anything starts, naming the attribute and the two ways out."""
    from .conftest import one_error_line

    r = run_cli(
        "train",
        "--env",
        "tests.tiny_envs:opaque",
        "--set",
        "farm.episodes=continue",
        "--logdir",
        str(tmp_path),
        env=WORKER_ENV,
    )
    assert r.returncode == 2
    line = one_error_line(r.stderr)
    assert "OpaqueEnv.sim" in line and "rlfarm_snapshot()" in line and 'farm.episodes = "fresh"' in line
    assert not (tmp_path / "cluster.json").exists() and not list(tmp_path.iterdir())  # nothing started


def test_a_bad_episodes_mode_is_one_error_line(tmp_path):
    from .conftest import one_error_line

    r = run_cli("train", "--set", "farm.episodes=forever", "--logdir", str(tmp_path))
    assert r.returncode != 0
    assert "farm.episodes must be fresh or continue" in one_error_line(r.stderr)


# ---- the run's streams, whatever the farm ---------------------------------------------------------
LONG_RUN = [
    "env.id=tests.tiny_envs:long_episodes",
    "farm.episodes=continue",
    "env.num_envs=2",
    "farm.num_tasks=2",
    "farm.steps_per_env=64",
    "policy.hidden_sizes=[16]",
]


def _iterations(redis_url: str, run_id: str, count: int, book=None, first: int = 0):
    """`count` SYNC iterations of 2 tasks x 2 LongEnv streams driven as the trainer drives them:
    each task names its stream and the snapshot its last task left; yields each batch and results."""
    from rlfarm.core.protocol import TaskSpec
    from rlfarm.core.rollout import Rollout, concat
    from rlfarm.core.streams import StreamBook

    d = task_channel(redis_url, run_id)
    book = book or StreamBook(2)
    for it in range(first, first + count):
        specs = [TaskSpec(run_id, "rollout", it, i, 0, 1, steps=64, stream=book.ref(i)) for i in range(2)]
        results = d.gather_group(specs)
        for i, r in enumerate(results):
            book.advance(r.stream, i)
        yield concat([Rollout.from_dict(r.rollout) for r in results]), results, book


@pytest.mark.parametrize("processes", [1, 2])
def test_a_sync_batch_holds_num_tasks_x_num_envs_distinct_streams_whatever_the_processes(processes, tmp_path):
    """The shipped Atari presets' shape in small: 2 tasks x 2 envs per iteration. Each batch holds 4
    distinct games, each advanced by its own tasks only (LongEnv's first observation is its step
    count / 1000; its second, noise from its own RNG). Before streams were the run's, one process ran
    both tasks of an iteration on its one stream: task 1 went on from where task 0 stopped."""
    from rlfarm.local.cluster import LocalCluster

    with LocalCluster(
        workers=processes, name=f"rlfarm-test-streams-{processes}", log_dir=tmp_path, extra_env=WORKER_ENV
    ) as farm:
        make_run(farm.redis_url, "distinct", LONG_RUN)
        workers = set()
        # At least 5 iterations, more (up to 14, within LongEnv's 1,000-step episode) until every
        # process has run a task: on a loaded machine one process can take both tasks for a while.
        for it, (batch, results, _) in enumerate(_iterations(farm.redis_url, "distinct", 14)):
            assert batch.obs.shape == (64, 4, 2)
            np.testing.assert_allclose(batch.obs[0, :, 0], it * 64 / 1000)  # each stream at its own step
            np.testing.assert_allclose(batch.obs[-1, :, 0], (it * 64 + 63) / 1000)
            assert len(set(batch.obs[0, :, 1].tolist())) == 4  # four games, not two played twice
            workers |= {r.worker for r in results}
            if it >= 4 and len(workers) == processes:
                break
        assert len(workers) == processes


def test_a_lost_snapshot_restarts_its_stream_from_new_seeds_and_says_why(farm):
    """Redis lost a stream's snapshot (expired, flushed): the next task starts the stream from the
    seeds of (run seed, stream, restart 1) and its result says why; the other stream goes on."""
    import redis as redis_py

    from rlfarm.farm import keys

    make_run(farm.redis_url, "lost-snapshot", LONG_RUN)
    runs = _iterations(farm.redis_url, "lost-snapshot", 3)
    *_, (batch, _, book) = runs
    redis_py.Redis.from_url(farm.redis_url).delete(keys.stream("lost-snapshot", book.after[1]))
    batch, results, book = next(_iterations(farm.redis_url, "lost-snapshot", 1, book, first=3))
    assert results[0].stream["restarts"] == 0 and results[0].stream.get("restart") is None
    assert results[1].stream["restarts"] == 1 and "is not in Redis" in results[1].stream["restart"]
    np.testing.assert_allclose(batch.obs[0, :2, 0], 3 * 64 / 1000)  # stream 0 went on
    np.testing.assert_allclose(batch.obs[0, 2:, 0], 0.0)  # stream 1 began a new episode
    assert book.restarts == [0, 1] and book.stats.restarted == 1


@pytest.mark.parametrize("depth", [900])
def test_a_snapshot_that_fails_half_way_restarts_its_stream_on_fresh_envs(farm, depth):
    """On a farm without a secret anyone who can write to Redis can name their own blob. One whose
    sub-env state nests 900 deep overflowed the restore's stack (RecursionError ended the run, and the
    half-restored env stayed cached). Now the stream restarts
    from new seeds, on envs made anew, and says why (issue 50)."""
    import hashlib

    import redis as redis_py
    import zstandard

    from rlfarm.core import codec, streams
    from rlfarm.farm import keys

    run = f"forged-{depth}"
    make_run(farm.redis_url, run, LONG_RUN)
    *_, (_, _, book) = _iterations(farm.redis_url, run, 2)
    client = redis_py.Redis.from_url(farm.redis_url)
    message = streams.decode(client.get(keys.stream(run, book.after[1])), book.after[1])
    deep: list = []
    for _ in range(depth):
        deep = [deep]
    message["env"]["envs"][1][-1]["attrs"]["t"] = deep
    blob = zstandard.ZstdCompressor().compress(codec.pack(message))
    forged = hashlib.sha256(blob).hexdigest()
    client.set(keys.stream(run, forged), blob)
    book.after[1] = forged
    batch, results, book = next(_iterations(farm.redis_url, run, 1, book, first=2))
    assert results[0].stream["restarts"] == 0 and results[0].stream.get("restart") is None
    assert results[1].stream["restarts"] == 1 and results[1].stream["restart"], results[1].stream
    np.testing.assert_allclose(batch.obs[0, :2, 0], 2 * 64 / 1000)  # stream 0 went on
    np.testing.assert_allclose(batch.obs[0, 2:, 0], 0.0)  # stream 1 began anew, at step 0
    # and the next task of stream 1 goes on from the fresh start's snapshot
    batch, results, book = next(_iterations(farm.redis_url, run, 1, book, first=3))
    assert results[1].stream["restarts"] == 1 and results[1].stream.get("restart") is None
    np.testing.assert_allclose(batch.obs[0, 2:, 0], 64 / 1000)


def test_a_snapshot_is_state_only_and_one_not_its_digests_is_said_to_be_forged(farm):
    """On a farm without a secret anyone who can write to Redis can name their own blob: a genuine
    snapshot with the env's configuration changed (LongEnv's step_seconds, what each step sleeps) was
    restored in silence. Now the worker refuses it, naming the attribute, and the stream restarts on
    fresh envs; a blob under a snapshot's key that is not the one its digest names is reported as
    forged (counted under security/* on a signed run: test_forged_keys.py) (issue 50)."""
    import hashlib

    import redis as redis_py
    import zstandard

    from rlfarm.core import codec, streams
    from rlfarm.farm import keys

    run = "forged-config"
    make_run(farm.redis_url, run, LONG_RUN)
    *_, (_, _, book) = _iterations(farm.redis_url, run, 2)
    client = redis_py.Redis.from_url(farm.redis_url)
    message = streams.decode(client.get(keys.stream(run, book.after[1])), book.after[1])
    assert message["env"]["envs"][1][-1]["attrs"]["step_seconds"] == 0.0
    message["env"]["envs"][1][-1]["attrs"]["step_seconds"] = 0.002
    blob = zstandard.ZstdCompressor().compress(codec.pack(message))
    book.after[1] = hashlib.sha256(blob).hexdigest()
    client.set(keys.stream(run, book.after[1]), blob)
    batch, results, book = next(_iterations(farm.redis_url, run, 1, book, first=2))
    assert results[0].stream.get("restart") is None
    assert "sets LongEnv.step_seconds, which is the env's configuration" in results[1].stream["restart"]
    assert results[1].stream["restarts"] == 1 and not results[1].stream.get("forged")
    np.testing.assert_allclose(batch.obs[0, 2:, 0], 0.0)  # stream 1 began anew
    client.set(keys.stream(run, book.after[0]), blob)  # another blob under stream 0's snapshot key
    batch, results, book = next(_iterations(farm.redis_url, run, 1, book, first=3))
    assert results[0].stream["forged"] is True and "does not match its digest" in results[0].stream["restart"]
    assert results[1].stream.get("restart") is None


@pytest.mark.skipif(__import__("importlib").util.find_spec("mpe2") is None, reason="needs the multiagent extra")
def test_a_multi_agent_games_continue_across_tasks_and_are_reported_whole(farm, tmp_path):
    """simple_spread's 25-step games in 10-step tasks: "fresh" would end no game; "continue" saves each
    game's PettingZoo objects with the stream, so every agent's episode is reported once, 25 steps."""
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        "spread-ppo",
        "--set",
        "env.num_envs=6",
        "--set",
        "farm.steps_per_env=10",
        "--set",
        "farm.episodes=continue",
        "--set",
        "eval.interval=0",
        "--set",
        "target_return=inf",
        "--total-steps",
        "1200",
        "--run-id",
        "continue-spread",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    episodes = read_csv(tmp_path / "continue-spread" / "episodes.csv")
    steps = read_summary(tmp_path / "continue-spread")["env_steps"]
    assert {int(e["episodic_length"]) for e in episodes} == {25}
    # 2 tasks x 6 agents: each of the 12 agent streams leaves at most one game unfinished
    assert steps // 25 >= len(episodes) >= (steps - 12 * 24) / 25

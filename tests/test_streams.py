"""farm.episodes = "continue": worker processes keep their envs running across tasks, so episodes
longer than a task are learned from and reported, each once and whole, on real Redis and Celery
workers. (Pure stream mechanics: test_rollout.py; a worker SIGKILLed mid-stream: test_faults.py.)"""

from __future__ import annotations

import pytest

from .conftest import read_csv, read_summary, run_cli
from .tiny_envs import LongEnv

pytestmark = pytest.mark.farm

LONG = ["--preset", "cartpole-ppo", "--env", "tests.tiny_envs:long_episodes", "--set", "env.num_envs=2",
        "--set", "farm.num_tasks=2", "--set", "farm.steps_per_env=64", "--set", "ppo.num_minibatches=2",
        "--set", "policy.hidden_sizes=[16]"]


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
    r = run_cli("train", "--redis", farm.redis_url, *LONG, "--set", "farm.episodes=continue",
                "--total-steps", "12288", "--run-id", "continue", "--logdir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    # the farm fixture: 2 pool processes x 2 sub-envs
    episodes = assert_whole_episodes(tmp_path / "continue", streams=4)
    assert len(episodes) >= 9


def test_fresh_mode_never_reaches_the_end_of_an_episode_longer_than_a_task(farm, tmp_path):
    """The documented trade-off: "fresh" tasks restart their episodes, so a 64-step task never sees
    step 65 of a 1,000-step episode, and nothing is reported."""
    r = run_cli("train", "--redis", farm.redis_url, *LONG, "--total-steps", "4096", "--run-id", "fresh",
                "--logdir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_csv(tmp_path / "fresh" / "episodes.csv") == []
    assert read_summary(tmp_path / "fresh")["env_steps"] == 4096


def test_a_bad_episodes_mode_is_one_error_line(tmp_path):
    from .conftest import one_error_line

    r = run_cli("train", "--set", "farm.episodes=forever", "--logdir", str(tmp_path))
    assert r.returncode != 0
    assert "farm.episodes must be fresh or continue" in one_error_line(r.stderr)

"""Atari through the farm: DeepMind's preprocessing on the workers, the Nature CNN, game scores.
Needs the atari extra (`pip install -e ".[atari]"`; .ci/run installs it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from .conftest import read_csv, run_cli

ale_py = pytest.importorskip("ale_py", reason='the atari extra is not installed: pip install -e ".[atari]"')
pytest.importorskip("cv2", reason='the atari extra is not installed (OpenCV): pip install -e ".[atari]"')


def test_preprocessing_makes_stacked_84x84_grayscale_uint8_frames():
    from rlfarm.envs import describe, make_vector_env

    spec = describe("ALE/Pong-v5")
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8" and spec.is_image
    assert spec.image_layout == "CHW" and spec.discrete and spec.action_dim == 6
    envs = make_vector_env("ALE/Pong-v5", 2, trusted=False)  # a registered id: no allowlist needed
    obs, _ = envs.reset(seed=[1, 2])
    for _ in range(60):  # past the first second, in which nothing moves
        obs, reward, *_ = envs.step(np.zeros(2, np.int64))
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert not np.array_equal(obs[0, 0], obs[0, 3])  # four different frames, oldest first
    envs.close()


def test_a_lost_life_is_signalled_without_ending_the_game():
    from rlfarm.envs import make_env

    env = make_env("ALE/Breakout-v5", options={"terminal_on_life_loss": True})
    env.reset(seed=3)
    lives, lost, steps = env.unwrapped.ale.lives(), 0, 0
    terminated = truncated = False
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(1)  # FIRE: serve and let the ball go by
        steps += 1
        now = env.unwrapped.ale.lives()
        assert info["life_lost"] == (now < lives and not terminated)
        lost += info["life_lost"]
        lives = now
    assert lost == 4 and terminated  # five lives: four lost in play, the game over ends the episode
    env.close()


def test_pong_preset_trains_through_the_cli_with_the_cnn_and_reports_game_scores(farm, tmp_path):
    """A few thousand steps of the `pong` preset on real workers: finite losses, the CNN learner, and
    whole games (longer than a task: "continue" episodes) reported in game score."""
    r = run_cli("train", "--redis", farm.redis_url, "--preset", "pong", "--total-steps", "7168",
                "--set", "env.num_envs=2", "--run-id", "pong", "--logdir", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for row in read_csv(tmp_path / "pong" / "progress.csv") if int(row["policy_version"]) > 0]
    losses = [float(row["losses/value_loss"]) for row in rows] + [float(row["losses/policy_loss"]) for row in rows]
    assert rows and all(math.isfinite(x) for x in losses)
    episodes = read_csv(tmp_path / "pong" / "episodes.csv")
    assert episodes, "no whole game reported"
    for e in episodes:
        score = float(e["episodic_return"])
        assert score == int(score) and -21 <= score <= 21  # points, as the game counts them
        assert int(e["episodic_length"]) > 128  # a whole game: longer than one 128-step task

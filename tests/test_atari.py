"""Atari through the farm: DeepMind's preprocessing on the workers, the Nature CNN, game scores.
Needs the atari extra (`pip install -e ".[atari]"`; .ci/run installs it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlfarm.config import machine_cores

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
    summary = json.loads((tmp_path / "pong" / "summary.json").read_text())
    # A farm given by --redis runs no worker of this run's on the trainer's machine: the CNN's
    # learner takes every core (torch_threads "auto").
    assert summary["trainer_threads"] == machine_cores()
    rows = [row for row in read_csv(tmp_path / "pong" / "progress.csv") if int(row["policy_version"]) > 0]
    losses = [float(row["losses/value_loss"]) for row in rows] + [float(row["losses/policy_loss"]) for row in rows]
    assert rows and all(math.isfinite(x) for x in losses)
    episodes = read_csv(tmp_path / "pong" / "episodes.csv")
    assert episodes, "no whole game reported"
    for e in episodes:
        score = float(e["episodic_return"])
        assert score == int(score) and -21 <= score <= 21  # points, as the game counts them
        assert int(e["episodic_length"]) > 128  # a whole game: longer than one 128-step task


def _wrapper_chain(env_id: str, num_envs: int, options: dict):
    """The gymnasium wrapper chain as a vector env: what tasks stepped before ale-py's own."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfarm.envs import make_env

    return SyncVectorEnv([lambda: make_env(env_id, options=options)] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


def test_tasks_step_ale_pys_vector_env_with_the_wrapper_chains_frames_and_scores():
    """make_vector_env takes ale-py's C++ vector env for ALE ids: after the first stacked frames of a
    reset, every frame is the wrapper chain's bit for bit, and so are rewards and game scores. (On an
    id without sticky actions: with them, each side draws its repeats from its own generator.)"""
    from rlfarm.envs.atari import NativeVector
    from rlfarm.envs import make_vector_env

    assert isinstance(make_vector_env("ALE/Pong-v5", 2, trusted=False), NativeVector)
    options = {"noop_max": 0, "clip_rewards": True, "frame_stack": 4}
    native = make_vector_env("PongNoFrameskip-v4", 2, trusted=False, options=options)
    assert isinstance(native, NativeVector)
    chain = _wrapper_chain("PongNoFrameskip-v4", 2, options)
    a, _ = native.reset(seed=[5, 6])
    b, _ = chain.reset(seed=[5, 6])
    assert a.shape == b.shape == (2, 4, 84, 84) and a.dtype == b.dtype == np.uint8
    assert np.array_equal(a[:, -1], b[:, -1])  # the newest frame of the reset
    rng = np.random.default_rng(0)
    scored = 0.0
    for t in range(400):
        actions = rng.integers(0, 6, 2)
        a, ra, ta, ua, ia = native.step(actions)
        b, rb, tb, ub, ib = chain.step(actions)
        if t >= 3:  # once the stack holds no reset padding
            assert np.array_equal(a, b), f"frames differ at step {t}"
        assert np.array_equal(ra, rb) and np.array_equal(ia["raw_reward"], ib["raw_reward"])
        assert np.array_equal(ta, tb) and np.array_equal(ua, ub)
        scored += float(np.abs(ia["raw_reward"]).sum())
    assert scored > 0  # points were scored in 400 steps of random play: rewards were compared
    native.close()
    chain.close()


def test_ale_pys_vector_env_signals_lost_lives_and_hands_over_final_observations():
    """Breakout with terminal_on_life_loss through ale-py's vector env: a life lost is flagged while
    the game goes on; an episode cut by the frame cap leaves its real last frames in final_obs."""
    import gymnasium as gym

    from rlfarm.envs.atari import NativeVector

    envs = NativeVector("ALE/Breakout-v5", 2, {"terminal_on_life_loss": True, "noop_max": 0})
    envs.reset(seed=[1, 2])
    lost = np.zeros(2, int)
    ended = np.zeros(2, bool)
    for _ in range(5000):
        obs, reward, terminated, truncated, info = envs.step(np.ones(2, np.int64))  # FIRE, then idle
        assert not (info["life_lost"] & (terminated | truncated)).any()
        lost += np.where(ended, 0, info["life_lost"])
        ended |= terminated
        if ended.all():
            break
    assert ended.all() and (lost == 4).all()  # five lives: four lost in play, the fifth ends the game
    envs.close()

    cap = gym.registry["ALE/Pong-v5"].kwargs.get("max_num_frames_per_episode")
    assert cap  # the registered cap is what NativeVector passes on; a short one to see truncation:
    gym.register("rlfarm-test/PongShort-v5", entry_point=gym.registry["ALE/Pong-v5"].entry_point,
                 kwargs={**gym.registry["ALE/Pong-v5"].kwargs, "max_num_frames_per_episode": 400})
    try:
        short = NativeVector("rlfarm-test/PongShort-v5", 2, {"noop_max": 0})
        short.reset(seed=[1, 2])
        for step in range(1, 200):
            obs, _, terminated, truncated, info = short.step(np.zeros(2, np.int64))
            if truncated.any():
                break
        assert truncated.all() and not terminated.any() and step == 100  # 400 frames, 4 a step
        assert info["final_obs"].shape == (2, 4, 84, 84)
        assert not np.array_equal(info["final_obs"], obs)  # the cut game's frames, not the reset's
        short.close()
    finally:
        del gym.registry["rlfarm-test/PongShort-v5"]

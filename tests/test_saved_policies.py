"""Policy files written before the package redesign still play: best_policy.safetensors of a DQN, a SAC
and a PPO run (small networks), written by `rlfarm train` of the release before rlfarm/ became
subpackages (tests/data/*-before-redesign.safetensors), read by `rlfarm eval`'s own code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlfarm.evaluation import playback

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "algo, env_id, discrete",
    [("dqn", "CartPole-v1", True), ("sac", "Pendulum-v1", False), ("ppo", "CartPole-v1", True)],
)
def test_a_policy_file_of_the_release_before_plays(algo, env_id, discrete):
    stored = playback.from_file(DATA / f"{algo}-best_policy-before-redesign.safetensors")
    assert stored.algo == algo  # older files name no head: the algorithm is still told apart
    env, found_env = playback.open_env(stored)
    assert found_env == env_id
    network = playback.network_for(stored, env, found_env)
    # Every tensor of the file is loaded into the network it builds, none missing, none left over.
    assert set(network.state_dict()) >= set(stored.state)
    returns = playback.play(playback.actor_for(stored, env, found_env), env, found_env, episodes=2, seed=5)
    assert returns.shape == (2,) and np.isfinite(returns).all()
    assert hasattr(env.action_space, "n") == discrete

"""The shipped masked-velocity envs (rlfarm.envs.shipped.cartpole_no_vel, pendulum_no_vel): rl-baselines3-zoo's
CartPoleNoVel-v1 and PendulumNoVel-v1, the partially observable tasks recurrent policies are compared on.
Each is its gymnasium base env step for step, with the velocity entries of every observation at 0."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlfarm.envs import check_env_allowed, make_env, make_vector_env, snapshot
from rlfarm.envs.make import episode_limit
from rlfarm.envs.shipped.masked_velocity import MaskVelocity

pytestmark = pytest.mark.unit

# id -> (base env, its velocity entries, the entries kept, its episode limit)
ENVS = {
    "rlfarm/cartpole_no_vel": ("CartPole-v1", [1, 3], [0, 2], 500),
    "rlfarm/pendulum_no_vel": ("Pendulum-v1", [2], [0, 1], 200),
}
IDS = list(ENVS)


def _episodes(env: gym.Env, seed: int, episodes: int, actions: np.random.Generator):
    """Every step's (obs, reward, terminated, truncated) over `episodes` episodes, the first reset
    seeded; actions drawn from `actions`, so two envs given equal generators take the same ones."""
    env.action_space.seed(0)
    obs, _ = env.reset(seed=seed)
    out = [(obs, 0.0, False, False)]
    for _ in range(episodes):
        done = False
        while not done:
            if isinstance(env.action_space, gym.spaces.Discrete):
                action = int(actions.integers(env.action_space.n))
            else:
                action = actions.uniform(env.action_space.low, env.action_space.high).astype(np.float32)
            obs, reward, terminated, truncated, _ = env.step(action)
            out.append((obs, float(reward), terminated, truncated))
            done = terminated or truncated
        out.append((env.reset()[0], 0.0, False, False))
    return out


@pytest.mark.parametrize("env_id", IDS)
def test_built_by_its_id_through_the_env_factory_with_the_base_envs_spaces(env_id):
    base_id, _, _, limit = ENVS[env_id]
    check_env_allowed(env_id)  # shipped: a worker builds it without an allowlist
    env, base = make_env(env_id, trusted=False), gym.make(base_id)
    assert isinstance(env, MaskVelocity)
    # As the zoo's wrapper: the same observation size and space, so SB3 and rlfarm see the same thing.
    assert env.observation_space == base.observation_space and env.action_space == base.action_space
    assert episode_limit(env_id) == limit
    vector = make_vector_env(env_id, 3, trusted=False)
    assert vector.reset(seed=0)[0].shape == (3, *base.observation_space.shape)


@pytest.mark.parametrize("env_id", IDS)
def test_velocities_are_always_zero_and_the_rest_is_the_base_envs_step_for_step(env_id):
    """Same seed, same actions: rewards, ends and the kept entries equal the base env's over whole
    episodes, resets included (Pendulum's cut at its limit too); the masked entries are 0."""
    base_id, masked, kept, limit = ENVS[env_id]
    ours = _episodes(make_env(env_id), 3, 3, np.random.default_rng(5))
    theirs = _episodes(gym.make(base_id), 3, 3, np.random.default_rng(5))
    assert len(ours) == len(theirs)
    for step, ((obs, *rest), (base_obs, *base_rest)) in enumerate(zip(ours, theirs)):
        assert obs.dtype == base_obs.dtype and obs.shape == base_obs.shape
        assert (obs[masked] == 0).all(), step
        np.testing.assert_array_equal(obs[kept], base_obs[kept], err_msg=f"step {step}")
        assert rest == base_rest, step
    # The base env's velocities were not 0 to begin with: the mask is what hides them.
    assert any(np.abs(o[masked]).min() > 0 for o, *_ in theirs)
    if limit == 200:  # Pendulum never terminates: each episode is cut at its limit
        assert [r[3] for r in ours].count(True) == 3 and not any(r[2] for r in ours)


def test_cartpole_ends_when_the_pole_falls_as_its_base_does():
    """Pushing one way only: the pole falls (terminated) on the same step for both."""
    ends = []
    for env in (make_env("rlfarm/cartpole_no_vel"), gym.make("CartPole-v1")):
        env.reset(seed=11)
        for step in range(1, 501):
            _, _, terminated, truncated, _ = env.step(1)
            if terminated or truncated:
                ends.append((step, terminated, truncated))
                break
    assert ends[0] == ends[1] and ends[0][1] and ends[0][0] < 100


@pytest.mark.parametrize("env_id", IDS)
def test_a_vector_of_them_masks_the_final_observation_too(env_id):
    """SAME_STEP autoreset hands the ending step's observation over in info["final_obs"], which
    bootstrapping reads: it is masked as every other one."""
    _, masked, _, _ = ENVS[env_id]
    envs = make_vector_env(env_id, 2)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    finals = 0
    for _ in range(500 if "pendulum" in env_id else 200):
        obs, _, terminated, truncated, info = envs.step(envs.action_space.sample())
        assert (obs[:, masked] == 0).all()
        for i in np.flatnonzero(terminated | truncated):
            assert (info["final_obs"][i][masked] == 0).all()
            finals += 1
    assert finals >= 2


@pytest.mark.parametrize("env_id", IDS)
def test_a_snapshot_restored_into_another_env_goes_on_bit_for_bit(env_id):
    """farm.episodes = "continue": a stream's state moves to another worker process."""
    snapshot.check(env_id)
    first, second = make_vector_env(env_id, 2), make_vector_env(env_id, 2)
    first.reset(seed=1)
    second.reset(seed=2)
    first.action_space.seed(0)
    for _ in range(7):
        first.step(first.action_space.sample())
    snapshot.restore(second, snapshot.capture(first))
    actions = [first.action_space.sample() for _ in range(20)]
    for action in actions:
        a, b = first.step(action), second.step(action)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_indices_outside_the_observation_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        MaskVelocity(gym.make("CartPole-v1"), [4])

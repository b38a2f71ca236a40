"""Pure rollout code on tiny envs with hand-computed numbers: autoreset, truncation, GAE, seeds."""

import numpy as np
import pytest

from rlfarm.algos.ppo.ppo import compute_gae
from rlfarm.core.rollout import Rollout, collect, concat, task_seeds
from rlfarm.envs import make_vector_env

from .conftest import CountValue


def test_same_step_autoreset_on_termination():
    envs = make_vector_env("tests.tiny_envs:terminating", 1)
    r = collect(CountValue(), envs, n_steps=7, env_seeds=[0], action_seed=0)
    # NEXT_STEP autoreset would show an extra, unreal step with obs 3 and an ignored action.
    assert r.obs[:, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert r.dones[:, 0].tolist() == [False, False, True, False, False, True, False]
    assert r.rewards.sum() == 7
    assert r.final_values.sum() == 0  # terminated: nothing to bootstrap
    assert r.episode_returns.tolist() == [3.0, 3.0]
    assert r.episode_lengths.tolist() == [3, 3]
    assert r.last_values.tolist() == [1.0]


def test_truncation_bootstraps_from_real_final_observation():
    envs = make_vector_env("tests.tiny_envs:truncating", 1)
    r = collect(CountValue(), envs, n_steps=4, env_seeds=[0], action_seed=0)
    assert r.obs[:, 0, 0].tolist() == [0, 1, 2, 0]
    assert r.dones[:, 0].tolist() == [False, False, True, False]
    # The real final obs is 3 (the reset obs is 0): V = 3.
    assert r.final_values[:, 0].tolist() == [0, 0, 3, 0]
    adv, ret = compute_gae(r, gamma=0.5, gae_lambda=1.0)
    # By hand: next values 1, 2, V(final)=3, last V(1)=1; deltas 1.5, 1.0, 0.5, 1.5.
    np.testing.assert_allclose(adv[:, 0], [2.125, 1.25, 0.5, 1.5])
    np.testing.assert_allclose(ret[:, 0], [2.125, 2.25, 2.5, 1.5])


def test_gae_terminal_does_not_bootstrap():
    envs = make_vector_env("tests.tiny_envs:terminating", 1)
    r = collect(CountValue(), envs, n_steps=4, env_seeds=[0], action_seed=0)
    adv, ret = compute_gae(r, gamma=0.5, gae_lambda=0.5)
    # values 0,1,2,0; next values 1,2,(terminal)0,last V(1)=1
    deltas = np.array([1 + 0.5 * 1 - 0, 1 + 0.5 * 2 - 1, 1 + 0 - 2, 1 + 0.5 * 1 - 0])
    a3 = deltas[3]
    a2 = deltas[2]
    a1 = deltas[1] + 0.25 * a2
    a0 = deltas[0] + 0.25 * a1
    np.testing.assert_allclose(adv[:, 0], [a0, a1, a2, a3], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], adv[:, 0] + [0, 1, 2, 0], rtol=1e-6)


def test_multiple_subenvs_and_concat_keep_order():
    envs = make_vector_env("tests.tiny_envs:truncating", 3)
    a = collect(CountValue(), envs, 5, [0, 1, 2], 0)
    b = collect(CountValue(), make_vector_env("tests.tiny_envs:terminating", 2), 5, [0, 1], 0)
    joined = concat([a, b])
    assert joined.obs.shape == (5, 5, 1)
    np.testing.assert_array_equal(joined.dones[:, :3], a.dones)
    np.testing.assert_array_equal(joined.dones[:, 3:], b.dones)
    assert joined.num_steps == 25
    assert len(joined.episode_returns) == len(a.episode_returns) + len(b.episode_returns)


def test_task_seeds_are_deterministic_and_distinct():
    assert task_seeds(1, 2, 3, 4) == task_seeds(1, 2, 3, 4)
    assert task_seeds(1, 2, 3, 4) != task_seeds(1, 2, 4, 4)
    assert task_seeds(1, 2, 3, 4) != task_seeds(1, 3, 3, 4)
    env_seeds, _ = task_seeds(7, 0, 0, 8)
    assert len(set(env_seeds)) == 8


def test_collect_is_reproducible_with_a_real_policy():
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.envs import describe

    torch.manual_seed(0)
    actor = ActorCritic(describe("CartPole-v1"), PolicyConfig()).actor_snapshot()
    seeds, aseed = task_seeds(1, 0, 0, 2)
    r1 = collect(actor, make_vector_env("CartPole-v1", 2), 300, seeds, aseed)
    r2 = collect(actor, make_vector_env("CartPole-v1", 2), 300, seeds, aseed)
    for k, v in r1.to_dict().items():
        np.testing.assert_array_equal(v, getattr(r2, k), err_msg=k)
    assert len(r1.episode_returns) > 0  # a random policy drops the pole well within 300 steps
    assert Rollout.from_dict(r1.to_dict()).num_steps == 600


@pytest.mark.parametrize("env_id", ["Pendulum-v1"])
def test_box_actions_are_clipped_for_env_but_stored_raw(env_id):
    import torch

    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.config import PolicyConfig
    from rlfarm.envs import describe

    torch.manual_seed(0)
    actor = ActorCritic(describe(env_id), PolicyConfig(init_log_std=1.5)).actor_snapshot()
    r = collect(actor, make_vector_env(env_id, 2), 200, [0, 1], 0)
    assert np.abs(r.actions).max() > 2.0  # wide Gaussian samples beyond the bounds are kept raw
    # Pendulum truncates at 200 steps: every sub-env ends exactly once, bootstrapped (not terminal).
    assert r.dones[-1].all() and (r.final_values[-1] != 0).all()
    assert r.episode_lengths.tolist() == [200, 200]


# ---- "continue": env streams across tasks --------------------------------------------------------
def _stream(env_id: str, n: int, seeds: list[int]):
    from rlfarm.core.streams import EnvStream

    return EnvStream(make_vector_env(env_id, n), seeds)


def test_a_stream_goes_on_where_its_last_task_left_it():
    """Three 2-step tasks on a 3-step terminating env: one task alone never sees an episode end,
    the stream does, and reports it once, whole, in the task where it ends."""
    stream = _stream("tests.tiny_envs:terminating", 1, [0])
    tasks = [collect(CountValue(), None, 2, [99], 0, stream=stream) for _ in range(3)]
    assert [t.obs[:, 0, 0].tolist() for t in tasks] == [[0, 1], [2, 0], [1, 2]]
    assert [t.episode_returns.tolist() for t in tasks] == [[], [3.0], [3.0]]
    assert [t.episode_lengths.tolist() for t in tasks] == [[], [3], [3]]
    assert tasks[0].last_values.tolist() == [2.0]  # the cut is bootstrapped as in "fresh"
    fresh = [collect(CountValue(), make_vector_env("tests.tiny_envs:terminating", 1), 2, [0], 0) for _ in range(3)]
    assert all(t.episode_returns.size == 0 for t in fresh)  # "fresh" never reaches an episode end


def test_stream_seeds_are_the_runs_own_distinct_per_stream_and_restart():
    """A stream's seeds come from the run (seed, stream index, restarts), never from the process that
    starts it: any process starts stream 3 alike, and no two streams or restarts start alike."""
    from rlfarm.core.streams import stream_seeds

    a = stream_seeds(1, 0, 0, 4)
    assert a == stream_seeds(1, 0, 0, 4)
    others = [stream_seeds(1, 1, 0, 4), stream_seeds(1, 0, 1, 4), stream_seeds(2, 0, 0, 4)]
    assert all(set(a).isdisjoint(o) for o in others)
    assert len(set(a)) == 4  # the sub-envs of one stream differ too


def test_the_stream_cache_keeps_streams_by_run_and_index_and_closes_the_least_recently_used():
    from rlfarm.core.streams import StreamCache

    cache = StreamCache(size=2)
    a, b, c = (_stream("tests.tiny_envs:terminating", 1, [i]) for i in range(3))
    cache.put("run", 0, a)
    cache.put("run", 1, b)
    assert cache.get("run", 0) is a and cache.get("other", 0) is None  # a: now the most recently used
    cache.put("other", 0, c)  # evicts ("run", 1), the least recently used
    assert ("run", 1) not in cache and ("run", 0) in cache and len(cache) == 2
    assert b.envs.closed and not a.envs.closed
    cache.drop("run")
    assert ("run", 0) not in cache and a.envs.closed and ("other", 0) in cache


class ScoredEnv:
    """4-step episodes whose reward is clipped for learning (1 per step) while info carries the real
    game score (10 per step), and a life lost at step 2 (the Atari wrappers' conventions)."""

    @staticmethod
    def make():
        import gymnasium as gym

        class Env(gym.Env):
            observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return np.zeros(1, np.float32), {}

            def step(self, action):
                self.t += 1
                info = {"raw_reward": 10.0, "life_lost": self.t == 2}
                return np.full(1, self.t, np.float32), 1.0, self.t >= 4, False, info

        return Env()


def test_episode_returns_are_the_real_score_and_a_lost_life_is_a_terminal_without_reset():
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    envs = SyncVectorEnv([ScoredEnv.make] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    r = collect(CountValue(), envs, n_steps=6, env_seeds=[0, 1], action_seed=0, keep_next_obs=True)
    assert r.rewards.sum() == 12  # learning sees the clipped rewards
    assert r.episode_returns.tolist() == [40.0, 40.0]  # reported: the game score of whole episodes
    assert r.episode_lengths.tolist() == [4, 4]
    # the life lost at step 2 ends a learning episode (no bootstrap), the game is not reset
    assert r.dones[:, 0].tolist() == [False, True, False, True, False, True]
    assert r.terminations[:, 0].tolist() == r.dones[:, 0].tolist()
    assert r.obs[:, 0, 0].tolist() == [0, 1, 2, 3, 0, 1]
    assert r.next_obs[1, 0, 0] == 2  # the real next observation after the lost life


class ConstantPolicy(CountValue):
    """Always `action`, with log-probability `logp`: tells which policy acted at each step."""

    def __init__(self, action: int, logp: float):
        self.action, self.logp = action, logp

    def act(self, obs, rng, deterministic=False):
        n = len(obs)
        return np.full(n, self.action, np.int64), np.full(n, self.logp, np.float32), self.value(obs)


def test_a_refreshed_policy_acts_from_the_step_it_arrives_and_its_logprobs_are_recorded():
    """async.refresh_steps: every 4 steps the task asks for a newer version; the second ask brings one."""
    envs = make_vector_env("tests.tiny_envs:truncating", 2)
    answers = iter([None, ConstantPolicy(1, -0.5), None])
    asked = []

    def refresh():
        asked.append(True)
        return next(answers)

    r = collect(ConstantPolicy(0, -0.1), envs, 12, [0, 1], 0, refresh=refresh, refresh_steps=4)
    assert len(asked) == 2  # at steps 4 and 8
    assert r.actions[:, 0].tolist() == [0] * 8 + [1] * 4
    np.testing.assert_allclose(r.logprobs[:, 1], [-0.1] * 8 + [-0.5] * 4)

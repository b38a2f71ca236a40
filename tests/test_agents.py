"""Multi-agent envs as vectors of agents (rlfarm.envs.agents): layout, autoreset, seeding, spaces,
what is refused, and collecting and evaluating with one policy for every agent."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from rlfarm.core.rollout import collect, run_episodes, task_seeds
from rlfarm.envs import describe, make_env, make_vector_env
from rlfarm.envs.agents import AgentVector
from rlfarm.envs.allowlist import check_env_allowed
from rlfarm.errors import EnvError

HAS_MPE2 = importlib.util.find_spec("mpe2") is not None
NO_MPE2 = 'mpe2 is not installed (pip install -e ".[multiagent]")'


class Same:
    """An actor that picks action 1 for every agent: the Echo agents then always agree."""

    def __init__(self, spec):
        self.spec = spec

    def act(self, obs, rng, deterministic=False):
        n = len(obs)
        return np.ones(n, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32)

    def value(self, obs):
        return np.zeros(len(obs), np.float32)


def test_a_game_fills_one_sub_env_per_agent_in_agent_order():
    envs = make_vector_env("tests.tiny_envs:echo", 6)
    assert isinstance(envs, AgentVector) and envs.num_envs == 6 and len(envs.games) == 3
    obs, _ = envs.reset(seed=list(range(100, 106)))
    assert obs.shape == (6, 3) and obs.dtype == np.float32
    assert obs[:, 0].tolist() == [0, 1, 0, 1, 0, 1]  # agent index, game after game
    assert obs[0, 2] == obs[1, 2] and obs[0, 2] != obs[2, 2]  # one draw per game, seeded per game


def test_spaces_are_one_agents_and_the_spec_counts_the_agents():
    spec = describe("tests.tiny_envs:echo")
    assert spec.agents == 2 and spec.obs_shape == (3,) and spec.discrete and spec.action_dim == 2
    assert spec.to_dict()["agents"] == 2
    assert type(spec).from_dict(spec.to_dict()) == spec
    assert "agents" not in describe("CartPole-v1").to_dict()  # single-agent runs' metadata as before


def test_games_end_together_and_reset_in_the_same_step_with_their_final_observations():
    envs = make_vector_env("tests.tiny_envs:echo", 4)
    envs.reset(seed=[1, 2, 3, 4])
    for t in range(1, 6):
        obs, rewards, terminated, truncated, info = envs.step(np.array([1, 1, 0, 1]))
        assert rewards.tolist() == [1, 1, 0, 0]
        assert not terminated.any()
        if t < 5:
            assert not truncated.any() and "final_obs" not in info
    assert truncated.all() and info["_final_obs"].all()
    assert [float(f[1]) for f in info["final_obs"]] == [0.5] * 4  # the last step's observation
    assert obs[:, 1].tolist() == [0.0] * 4  # and the new game's first one


def test_seeds_make_the_same_games():
    def first_draws(seeds):
        envs = make_vector_env("tests.tiny_envs:echo", 4)
        return envs.reset(seed=seeds)[0][:, 2].tolist()

    assert first_draws([7, 8, 9, 10]) == first_draws([7, 99, 9, 98])  # a game takes its first agent's seed
    assert first_draws([7, 8, 9, 10]) != first_draws([8, 8, 9, 10])


def test_what_is_refused_is_said_in_one_line():
    with pytest.raises(EnvError, match="env.num_envs = 3 is not a multiple of 2"):
        make_vector_env("tests.tiny_envs:echo", 3)
    with pytest.raises(EnvError, match="agents agent_0 and agent_1 have different observation spaces"):
        describe("tests.tiny_envs:echo_other_spaces")


def test_an_agent_done_before_the_others_is_out_of_its_game_until_the_game_ends():
    envs = make_vector_env("tests.tiny_envs:echo_leaving", 4)  # agent_1 is done at step 2 of 5
    envs.reset(seed=[1, 2, 3, 4])
    _, _, terminated, _, info = envs.step(np.array([0, 0, 0, 1]))
    assert not terminated.any() and "active" not in info
    _, rewards, terminated, _, info = envs.step(np.array([0, 0, 0, 1]))
    assert terminated.tolist() == [False, True, False, True] and info["_final_obs"].tolist() == [0, 1, 0, 1]
    assert info["active"].tolist() == [True, False, True, False]
    for _ in range(2):  # agent_1 sends nothing (its action is not taken), gets nothing
        _, rewards, terminated, truncated, info = envs.step(np.array([1, 0, 0, 0]))
        assert rewards.tolist() == [1, 0, 1, 0] and not (terminated | truncated)[[1, 3]].any()
        assert info["active"].tolist() == [True, False, True, False]
    obs, _, _, truncated, info = envs.step(np.array([0, 0, 0, 0]))  # the game ends: both play the next
    assert truncated.tolist() == [True, False, True, False] and "active" not in info
    assert obs[:, 1].tolist() == [0.0] * 4


def test_collect_marks_the_steps_an_agent_sat_out_and_counts_only_the_steps_it_played():
    envs = make_vector_env("tests.tiny_envs:echo_leaving", 2)
    spec = describe("tests.tiny_envs:echo_leaving")
    seeds, action_seed = task_seeds(1, 0, 0, 2)
    rollout = collect(Same(spec), envs, 10, seeds, action_seed, keep_next_obs=True)
    assert rollout.active[:, 0].all()
    assert rollout.active[:, 1].tolist() == [True, True, False, False, False] * 2
    assert rollout.episode_returns.tolist() == [2.0, 5.0, 2.0, 5.0]  # agent_1 left, then agent_0's game ended
    assert rollout.episode_lengths.tolist() == [2, 5, 2, 5]
    assert rollout.rewards[~rollout.active].sum() == 0 and not rollout.dones[~rollout.active].any()
    from rlfarm.core.replay import nstep_transitions
    from rlfarm.core.rollout import concat

    assert len(nstep_transitions(rollout, 3, 0.99)) == rollout.active.sum() == 14
    both = concat([rollout, dataclasses.replace(rollout, active=None)])
    assert both.active.shape == (10, 4) and both.active[:, 2:].all()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ppo_and_appo_learn_only_from_the_steps_an_agent_played(mode):
    from tests.test_algos import make, rollout_for, train_once

    algorithm, _ = make("ppo", "tests.tiny_envs:echo_leaving", mode=mode)
    rollout = rollout_for(algorithm, "tests.tiny_envs:echo_leaving", seed=3)
    assert rollout.active is not None and 0 < rollout.active.sum() < rollout.active.size
    seen = []
    evaluate = algorithm.policy.evaluate
    algorithm.policy.evaluate = lambda obs, actions, mask=None, autocast=None: (
        seen.append(len(obs)),
        evaluate(obs, actions, mask, autocast),
    )[1]
    before = {k: v.clone() for k, v in algorithm.state().items()}
    metrics = train_once(algorithm, rollout)
    epochs = algorithm.config.update_epochs
    learned = sum(seen) - (rollout.rewards.size if mode == "async" else 0)  # APPO's targets: one forward of all
    assert learned == epochs * rollout.active.sum()
    assert all(np.isfinite(v) for v in metrics.values())
    assert any(not torch.equal(before[k], v) for k, v in algorithm.state().items())


def test_pettingzoo_ids_are_allowed_without_an_allowlist_and_nothing_else_is_imported():
    check_env_allowed("mpe2/simple_spread_v3")  # fixed packages: like gymnasium's registered ids
    check_env_allowed("pettingzoo/classic/connect_four_v3")
    with pytest.raises(EnvError, match="unknown env 'mpe2/os.path'"):
        make_env("mpe2/os.path", trusted=False)
    with pytest.raises(EnvError, match="not allowed"):
        check_env_allowed("pettingzoo.utils:wrappers")


def test_collect_gives_each_agent_its_own_column_and_episodes():
    envs = make_vector_env("tests.tiny_envs:echo", 4)
    spec = describe("tests.tiny_envs:echo")
    seeds, action_seed = task_seeds(1, 0, 0, 4)
    rollout = collect(Same(spec), envs, 12, seeds, action_seed)
    assert rollout.obs.shape == (12, 4, 3) and rollout.rewards.shape == (12, 4)
    assert rollout.rewards.sum() == 48  # the agents always agree
    assert rollout.dones[4].all() and rollout.dones[9].all() and rollout.dones.sum() == 8
    assert rollout.episode_returns.tolist() == [5.0] * 8  # per agent: 2 games x 2 agents x 2 episodes
    assert rollout.final_values.shape == (12, 4)


def test_an_evaluation_episode_is_a_game_scored_by_its_agents_mean():
    env = make_env("tests.tiny_envs:echo")
    spec = describe("tests.tiny_envs:echo")
    returns = run_episodes(Same(spec), env, 3, seed=5)
    assert returns.tolist() == [5.0, 5.0, 5.0]


@pytest.mark.skipif(not HAS_MPE2, reason=NO_MPE2)
def test_simple_spread_runs_as_three_agents_a_game():
    spec = describe("mpe2/simple_spread_v3")
    assert spec.agents == 3 and spec.obs_shape == (18,) and spec.discrete and spec.action_dim == 5
    envs = make_vector_env("mpe2/simple_spread_v3", 6)
    seeds, action_seed = task_seeds(3, 0, 0, 6)
    rollout = collect(Same(spec), envs, 50, seeds, action_seed)
    assert len(rollout.episode_returns) == 12  # 25-step games: 2 games x 3 agents x 2 episodes
    assert (rollout.episode_returns < 0).all()  # distances to the landmarks are penalised


@pytest.mark.farm
@pytest.mark.skipif(not HAS_MPE2, reason=NO_MPE2)
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_async_learners_train_on_a_multi_agent_env_through_the_farm(farm, tmp_path, algo):
    """ASYNC DQN and APPO on simple_spread: every result's agent steps counted once, per-agent
    episodes reported, the final policy evaluated on whole games."""
    from .conftest import read_summary, run_cli

    run_id = f"spread-async-{algo}"
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--env",
        "mpe2/simple_spread_v3",
        "--mode",
        "async",
        "--total-steps",
        "3600",
        "--set",
        f"algo={algo}",
        "--set",
        "env.num_envs=6",
        "--set",
        "farm.steps_per_env=100",
        "--set",
        "eval.episodes=2",
        *(["--set", "dqn.learning_starts=600"] if algo == "dqn" else []),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / run_id)
    assert summary["env_steps"] == 3600 and summary["unique_task_ids_accepted"] == summary["task_ids_accepted"]
    assert "greedy evaluation of the final policy -" in result.stdout  # simple_spread's returns are negative
    with open(tmp_path / run_id / "episodes.csv") as f:
        assert sum(1 for _ in f) - 1 == 3600 // 25  # every agent's 25-step episodes, one row each
    if algo == "ppo":  # `rlfarm eval` plays whole games with the policy file, every agent acting
        played = run_cli("eval", "--policy", str(tmp_path / run_id / "final_policy.safetensors"), "--episodes", "2")
        assert played.returncode == 0, played.stderr[-3000:]
        assert played.stdout.strip().splitlines()[-1].startswith("mpe2/simple_spread_v3, policy v")


def test_a_run_whose_num_envs_does_not_fit_the_agents_is_refused_before_it_starts():
    from rlfarm.api import check_config, make_config
    from rlfarm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"env.num_envs = 5 is not a multiple of the env's 2 agents.*num_envs = 4"):
        check_config(make_config(None, env="tests.tiny_envs:echo", env__num_envs=5))
    # "continue" is accepted: its games are saved and restored with their streams (test_snapshot.py)
    check_config(make_config(None, env="tests.tiny_envs:echo", env__num_envs=4, farm__episodes="continue"))


def test_an_evaluation_game_lasts_until_its_last_agent_is_done():
    env = make_env("tests.tiny_envs:echo_leaving")
    returns = run_episodes(Same(describe("tests.tiny_envs:echo_leaving")), env, 2, seed=5)
    assert returns.tolist() == [3.5, 3.5]  # (2 + 5) / 2: agent_1 left after 2 steps, agent_0 played 5


def test_an_agent_that_joins_late_sits_out_until_its_first_observation():
    envs = make_vector_env("tests.tiny_envs:echo_joining", 4)  # agent_1 joins at step 2 of 5
    obs, info = envs.reset(seed=[1, 2, 3, 4])
    assert info["active"].tolist() == [True, False, True, False] and (obs[[1, 3]] == 0).all()
    _, rewards, _, _, info = envs.step(np.array([1, 0, 1, 0]))
    assert rewards.tolist() == [1, 0, 1, 0] and info["active"].tolist() == [True, False, True, False]
    obs, rewards, _, _, info = envs.step(np.array([1, 0, 1, 0]))  # agent_1's first observation
    assert "active" not in info and obs[1, 0] == 1.0 and rewards[1] == 0
    for _ in range(2):
        _, rewards, _, truncated, info = envs.step(np.array([1, 1, 1, 1]))
        assert rewards.tolist() == [1, 1, 1, 1]
    _, _, _, truncated, info = envs.step(np.array([1, 1, 1, 1]))  # the game ends for both; agent_1 waits again
    assert truncated.all() and info["game_ended"].all() and info["active"].tolist() == [True, False, True, False]

    spec = describe("tests.tiny_envs:echo_joining")
    seeds, action_seed = task_seeds(1, 0, 0, 2)
    rollout = collect(Same(spec), make_vector_env("tests.tiny_envs:echo_joining", 2), 10, seeds, action_seed)
    assert rollout.active[:, 0].all() and rollout.active[:, 1].tolist() == [False, False, True, True, True] * 2
    assert rollout.episode_lengths.tolist() == [5, 3, 5, 3]  # agent_1 played the last 3 steps of each game
    assert rollout.rewards[~rollout.active].sum() == 0
    # An evaluation game scores the agents that were in it, agent_1 from its joining on.
    returns = run_episodes(Same(spec), make_env("tests.tiny_envs:echo_joining"), 2, seed=5)
    assert returns.tolist() == [4.0, 4.0]  # (5 + 3) / 2


def test_action_masks_of_a_parallel_env_travel_to_the_actor_and_no_illegal_action_is_taken():
    from rlfarm.algos import network_for
    from rlfarm.config import RunConfig

    spec = describe("tests.tiny_envs:echo_masked")
    assert spec.action_mask and spec.obs_dim == 3  # the Dict's "observation", with its mask beside
    envs = make_vector_env("tests.tiny_envs:echo_masked", 8)
    obs, info = envs.reset(seed=list(range(8)))
    assert obs.shape == (8, 3) and info["action_mask"].all()  # step 0: both actions legal
    _, _, _, _, info = envs.step(np.zeros(8, np.int64))
    assert info["action_mask"].tolist() == [[True, False]] * 8
    envs.step(np.ones(8, np.int64))  # illegal at an odd step: the env counts them
    assert sum(game.illegal for game in envs.games) == 8

    torch.manual_seed(0)
    actor = network_for("ppo", spec, RunConfig().policy).actor_snapshot()
    envs = make_vector_env("tests.tiny_envs:echo_masked", 8)
    seeds, action_seed = task_seeds(3, 0, 0, 8)
    rollout = collect(actor, envs, 500, seeds, action_seed, keep_next_obs=True)
    assert sum(game.illegal for game in envs.games) == 0
    taken = rollout.actions.reshape(-1)
    assert rollout.action_masks.reshape(-1, 2)[np.arange(len(taken)), taken].all()
    assert (taken == 1).sum() > 500  # action 1 is taken where it is legal: the mask is not all-or-nothing
    ended = rollout.dones
    # A game's final observation (step 5, odd) has its own mask, not the next game's first (all legal).
    assert ended.any() and (rollout.next_action_masks[ended] == [True, False]).all()


@pytest.mark.farm
def test_a_game_an_agent_leaves_early_trains_through_the_farm(farm, tmp_path):
    """Rollout.active travels in results: the episodes a run reports are the agents' own (2 and 5
    steps), and the run trains and evaluates to its end."""
    from .conftest import read_summary, run_cli

    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "leaving",
        "--logdir",
        str(tmp_path),
        "--env",
        "tests.tiny_envs:echo_leaving",
        "--total-steps",
        "800",
        "--set",
        "env.num_envs=4",
        "--set",
        "farm.steps_per_env=50",
        "--set",
        "eval.episodes=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "leaving")["env_steps"] == 800
    with open(tmp_path / "leaving" / "episodes.csv") as f:
        lengths = {int(r["episodic_length"]) for r in csv.DictReader(f)}
    assert lengths == {2, 5}

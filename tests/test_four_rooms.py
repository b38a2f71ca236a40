"""The shipped four-rooms envs (rlfarm.envs.shipped): the flat gridworld and its two-level form,
whose upper level acts only at its decisions (Rollout.active) while the task's reward reaches it."""

from __future__ import annotations

import numpy as np
import pytest

from rlfarm.core.rollout import collect
from rlfarm.envs import check_env_allowed, make_env, make_vector_env, space_spec
from rlfarm.envs.shipped.four_rooms import CELLS, GOAL, HALLWAYS, INDEX, START_ROOM, moved
from rlfarm.envs.shipped.four_rooms_two_level import K

TWO_LEVEL = "rlfarm/four_rooms_two_level"
MAP = {"policy_map": ["upper=upper", "lower=lower"]}


def test_walls_stop_moves_and_only_the_goal_pays():
    assert len(CELLS) == 104 and all(h in INDEX for h in HALLWAYS)
    assert moved((1, 1), 0) == (1, 1) and moved((1, 1), 1) == (2, 1)  # the top wall; a free cell
    assert moved((3, 5), 3) == (3, 6) and moved((2, 5), 3) == (2, 5)  # the hallway; the wall beside it
    env = make_env("rlfarm/four_rooms")
    env.unwrapped.slip = 0.0  # (moves slip a third of the time: below, every move goes where it is meant)
    obs, _ = env.reset(seed=0)
    assert obs.sum() == 1 and CELLS[int(obs.argmax())] in START_ROOM
    env.unwrapped.cell = (GOAL[0] - 1, GOAL[1])
    _, reward, terminated, truncated, _ = env.step(1)
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.reset(seed=1)
    rewards = [env.step(0)[1:4] for _ in range(100)]  # walking into the top wall: cut at 100 moves
    assert rewards[-1] == (0.0, False, True) and all(r == (0.0, False, False) for r in rewards[:-1])


def test_a_move_slips_to_another_direction_a_third_of_the_time():
    from rlfarm.envs.shipped.four_rooms import slipped

    rng = np.random.default_rng(0)
    taken = np.array([slipped(0, rng) for _ in range(30_000)])
    assert abs((taken == 0).mean() - 2 / 3) < 0.01 and all(abs((taken == a).mean() - 1 / 9) < 0.01 for a in (1, 2, 3))
    assert all(slipped(4, rng) == 4 for _ in range(100))  # "stay" stays


def test_shipped_envs_need_no_allowlist():
    check_env_allowed("rlfarm/four_rooms")
    check_env_allowed(TWO_LEVEL)


def test_the_upper_level_decides_at_its_subgoal_or_after_k_steps_and_the_lower_is_paid_there():
    env = make_vector_env(TWO_LEVEL, 2, options=MAP)
    game = env.games[0]
    game.slip = 0.0
    env.reset(seed=0)
    game.cell = (3, 4)  # two moves left of the first hallway, (3, 6)
    _, rewards, _, _, info = env.step(np.array([0, 3]))  # upper: subgoal 0 (that hallway); lower: right
    assert info["active"].tolist() == [False, True]  # the upper waits for its subgoal
    _, rewards, _, _, info = env.step(np.array([4, 3]))  # the upper's action is ignored; lower reaches it
    assert rewards.tolist() == pytest.approx([0.0, 1.1])  # arriving (1) by a move that closed the distance (0.1)
    assert "active" not in info  # subgoal reached: it decides again
    for step in range(K):  # a subgoal never reached: it decides again after K = 12 steps
        _, _, _, _, info = env.step(np.array([4, 4]))  # (the goal, then stay: never there)
        assert ("active" not in info) == (step == K - 1), step


def test_collect_marks_the_upper_levels_waiting_steps_and_its_learner_sees_decisions_only():
    from rlfarm.algos.group import policy_rollout

    envs = make_vector_env(TWO_LEVEL, 8, options=MAP)
    for game in envs.games:
        game.slip = 0.0
    spec = space_spec(envs)
    assert spec.policies == ("upper", "lower") and spec.agent_obs_dims == (104, 109)

    class Walker:  # the lower walks right, the upper always picks the goal
        def __init__(self):
            self.spec = spec

        def act(self, obs, rng, deterministic=False):
            n = len(obs)
            return np.full(n, 3, np.int64), np.zeros(n, np.float32), np.zeros(n, np.float32)

        def value(self, obs):
            return np.zeros(len(obs), np.float32)

    rollout = collect(Walker(), envs, 40, list(range(8)), 0)
    upper = policy_rollout(rollout, spec, "upper")
    lower = policy_rollout(rollout, spec, "lower")
    assert lower.active.all() and upper.obs.shape == (40, 4, 104) and lower.obs.shape == (40, 4, 109)
    decisions = upper.active.sum(axis=0)
    assert (decisions == 4).all(), decisions  # steps 0, 12, 24, 36: walking right reaches no subgoal

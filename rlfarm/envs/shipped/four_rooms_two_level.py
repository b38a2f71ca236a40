"""Four rooms (rlfarm.envs.shipped.four_rooms) as a two-level hierarchy, Coach's level managers in one
env: an upper policy picks a subgoal (one of the four hallways, or the goal) and a lower policy moves
towards it, each an agent of a PettingZoo Parallel env, mapped to its own policy
(`env.policy_map = ["upper=upper", "lower=lower"]`, rlfarm.algos.group).

- The lower level acts at every step on its cell and its subgoal (one-hot), with 4 moves and "stay",
  and is rewarded 1 when it arrives at the subgoal, and 0.1 for each move that brings it closer
  through the rooms (less one for each that takes it away): the lower level's environment is the
  subgoal, and it never sees the task's reward.
- The upper level decides when its subgoal is reached or `k` steps have passed since it chose (a
  semi-MDP step); between decisions its action is ignored and it says so (info "acting": False), so
  the rollout marks those steps (Rollout.active) and its learner learns from its decisions only. It
  is rewarded with the task's reward at every step, so a decision's return is what followed it until
  the next decision (the next step's value) and beyond: the upper level's environment is the task.

Both levels end with the task (the goal reached, or `max_steps`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.envs.shipped.four_rooms import CELLS, GOAL, HALLWAYS, MAX_STEPS, SLIP, START_ROOM, moved, one_hot, slipped

SUBGOALS = [*HALLWAYS, GOAL]
K = 12  # steps before the upper level decides again, unless its subgoal is reached first
SHAPING = 0.1  # the lower level's reward per step of maze distance it closes to its subgoal


def maze_distances(target: tuple[int, int]) -> dict[tuple[int, int], int]:
    """Moves from every free cell to `target` through the rooms (breadth-first)."""
    distance = {target: 0}
    frontier = [target]
    while frontier:
        nearer = []
        for cell in frontier:
            for action in range(4):
                step = moved(cell, action)
                if step not in distance:
                    distance[step] = distance[cell] + 1
                    nearer.append(step)
        frontier = nearer
    return distance


DISTANCES = [maze_distances(goal) for goal in SUBGOALS]


class TwoLevelFourRooms:
    metadata = {"name": "four_rooms_two_level", "is_parallelizable": True, "render_modes": []}

    def __init__(self, k: int = K, max_steps: int = MAX_STEPS, slip: float = SLIP, render_mode: str | None = None):
        self.possible_agents = ["upper", "lower"]
        self.agents: list[str] = []
        self.k = k
        self.max_steps = max_steps
        self.slip = slip
        self.render_mode = None
        self._spaces = {
            "upper": gym.spaces.Box(0.0, 1.0, (len(CELLS),), np.float32),
            "lower": gym.spaces.Box(0.0, 1.0, (len(CELLS) + len(SUBGOALS),), np.float32),
        }
        self._rng = np.random.default_rng()
        self.cell, self.subgoal, self.since, self.steps, self.deciding = START_ROOM[0], 0, 0, 0, True

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(len(SUBGOALS))  # the upper's subgoals; the lower's 4 moves and "stay"

    def _observations(self) -> dict[str, np.ndarray]:
        goal = np.zeros(len(SUBGOALS), np.float32)
        goal[self.subgoal] = 1.0
        here = one_hot(self.cell)
        return {"upper": here, "lower": np.concatenate([here, goal])}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.cell = START_ROOM[int(self._rng.integers(len(START_ROOM)))]
        self.subgoal, self.since, self.steps, self.deciding = 0, 0, 0, True
        return self._observations(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, Any]):
        if self.deciding:
            self.subgoal, self.since = int(actions["upper"]), 0
        before, self.cell = self.cell, moved(self.cell, slipped(int(actions["lower"]), self._rng, self.slip))
        self.steps += 1
        self.since += 1
        reached_goal = self.cell == GOAL
        target = SUBGOALS[self.subgoal]
        # Paid for arriving, not for being there: a lower level paid while it stays on its subgoal
        # learned to stay, and the upper level's task went undone. A subgoal it is already on is a
        # decision wasted: the upper level decides again at once.
        reached_subgoal = self.cell == target
        arrived = reached_subgoal and before != target
        self.deciding = reached_subgoal or self.since >= self.k
        done = reached_goal
        cut = self.steps >= self.max_steps and not done
        observations = self._observations()
        closer = DISTANCES[self.subgoal][before] - DISTANCES[self.subgoal][self.cell]
        rewards = {"upper": float(reached_goal), "lower": float(arrived) + SHAPING * closer}
        terminations = dict.fromkeys(self.agents, done)
        truncations = dict.fromkeys(self.agents, cut)
        infos = {"upper": {"acting": self.deciding}, "lower": {}}
        if done or cut:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass


def parallel_env(**kwargs: Any) -> TwoLevelFourRooms:
    return TwoLevelFourRooms(**kwargs)

"""The four-rooms gridworld (Sutton, Precup and Singh 1999), a sparse-reward navigation task: start in
the top-left room, reach the goal in the bottom-right one (reward 1, the only reward) within
`max_steps` moves. As in the paper, a move goes where it was meant with probability 2/3, else in one
of the other three directions (which also keeps a greedy policy from walking into a wall forever).
The observation is the agent's cell, one-hot over the 104 free cells.

    rlfarm train --env rlfarm/four_rooms            # one flat policy
    rlfarm train --preset four-rooms-two-level      # rlfarm/four_rooms_two_level: two levels
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

LAYOUT = (
    "wwwwwwwwwwwww",
    "w     w     w",
    "w     w     w",
    "w           w",
    "w     w     w",
    "w     w     w",
    "ww wwww     w",
    "w     www www",
    "w     w     w",
    "w     w     w",
    "w           w",
    "w     w     w",
    "wwwwwwwwwwwww",
)
CELLS = [(r, c) for r, row in enumerate(LAYOUT) for c, ch in enumerate(row) if ch == " "]
INDEX = {cell: i for i, cell in enumerate(CELLS)}
HALLWAYS = [(3, 6), (6, 2), (7, 9), (10, 6)]
GOAL = (11, 11)
START_ROOM = [(r, c) for r, c in CELLS if r <= 5 and c <= 5]  # the top-left room
MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1), (0, 0))  # up, down, left, right, stay
MAX_STEPS = 100
SLIP = 1 / 3  # the chance a move goes in one of the other three directions


def one_hot(cell: tuple[int, int]) -> np.ndarray:
    out = np.zeros(len(CELLS), np.float32)
    out[INDEX[cell]] = 1.0
    return out


def slipped(action: int, rng: np.random.Generator, slip: float = SLIP) -> int:
    """The move taken for `action` (0-3; 4, stay, always stays): another of the four with chance `slip`."""
    if action >= 4 or rng.random() >= slip:
        return action
    return int((action + 1 + rng.integers(3)) % 4)


def moved(cell: tuple[int, int], action: int) -> tuple[int, int]:
    dr, dc = MOVES[int(action)]
    target = (cell[0] + dr, cell[1] + dc)
    return target if target in INDEX else cell  # walls stop a move


class FourRooms(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = MAX_STEPS, slip: float = SLIP, render_mode: str | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1.0, (len(CELLS),), np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.max_steps = max_steps
        self.slip = slip
        self.cell = START_ROOM[0]
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.cell = START_ROOM[int(self.np_random.integers(len(START_ROOM)))]
        self.steps = 0
        return one_hot(self.cell), {}

    def step(self, action: Any):
        self.cell = moved(self.cell, slipped(int(action), self.np_random, self.slip))
        self.steps += 1
        reached = self.cell == GOAL
        return one_hot(self.cell), float(reached), reached, self.steps >= self.max_steps and not reached, {}


def env(**kwargs: Any) -> FourRooms:
    return FourRooms(**kwargs)

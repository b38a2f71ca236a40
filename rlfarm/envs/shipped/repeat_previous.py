"""POPGym's RepeatPreviousEasy (Morad et al. 2023, "POPGym: Benchmarking Partially Observable
Reinforcement Learning"), its card one-hot: a card is dealt each step (one deck, 52 cards, 51 steps)
and the agent names the suit of the card dealt 4 steps before, rewarded +1/48 when right and -1/48
when wrong from the 5th step on (an episode's return is in [-1, 1]). The observation is the card
just dealt, so only a memory of the last 4 cards can answer: a feed-forward policy guesses, one
answer in four right, a return of about -0.5.

    pip install popgym
    rlfarm train --preset repeat-previous-lstm
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.errors import MissingPackage

SUITS = 4


class OneHotCard(gym.ObservationWrapper):
    """The dealt card's suit (Discrete(4)) as a one-hot float32 vector: rlfarm acts on Box observations."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (SUITS,), np.float32)

    def observation(self, observation: Any) -> np.ndarray:
        out = np.zeros(SUITS, np.float32)
        out[int(observation)] = 1.0
        return out


def env(render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    try:
        from popgym.envs.repeat_previous import RepeatPreviousEasy
    except ImportError:
        raise MissingPackage("rlfarm/repeat_previous needs POPGym: pip install popgym") from None
    return OneHotCard(RepeatPreviousEasy(**kwargs))

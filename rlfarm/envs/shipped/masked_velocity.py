"""Velocities masked out of an observation: the partially observable control tasks that recurrent
policies are compared on (rl-baselines3-zoo's `...NoVel` envs and its MaskVelocityWrapper, where
sb3-contrib's RecurrentPPO is benchmarked). The envs are `rlfarm/cartpole_no_vel` and
`rlfarm/pendulum_no_vel`; this module is the wrapper they share and has no env of its own.

As in the zoo, the masked entries are set to 0 and the observation keeps its size and its space, so
SB3 and rlfarm policies see exactly what the zoo's agents see; only a memory of past observations
(an LSTM's state, or frames stacked) can recover the velocities.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

# The entries each base env's observation holds velocities in (rl-baselines3-zoo's table).
VELOCITY_INDICES: dict[str, tuple[int, ...]] = {
    "CartPole-v1": (1, 3),  # cart position, [cart velocity], pole angle, [pole angular velocity]
    "Pendulum-v1": (2,),  # cos(angle), sin(angle), [angular velocity]
}


class MaskVelocity(gym.ObservationWrapper):
    """`env` with the observation entries at `indices` always 0."""

    def __init__(self, env: gym.Env, indices: Sequence[int]):
        super().__init__(env)
        size = int(np.prod(env.observation_space.shape))
        if not indices or any(not 0 <= i < size for i in indices):
            raise ValueError(f"velocity indices {tuple(indices)} do not fit an observation of {size} entries")
        self.indices = tuple(int(i) for i in indices)

    def observation(self, observation: Any) -> np.ndarray:
        masked = np.array(observation, copy=True)  # the base env may hand out its own buffer
        masked[list(self.indices)] = 0
        return masked


def masked(base_id: str, render_mode: str | None = None, **kwargs: Any) -> MaskVelocity:
    """gymnasium's `base_id` (its episode limit included) with its velocities masked."""
    return MaskVelocity(gym.make(base_id, render_mode=render_mode, **kwargs), VELOCITY_INDICES[base_id])

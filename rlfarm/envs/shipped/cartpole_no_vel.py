"""CartPole-v1 without its velocities, rl-baselines3-zoo's `CartPoleNoVel-v1`: the observation is the
cart's position and the pole's angle, with the cart's velocity and the pole's angular velocity at 0
(the observation keeps its 4 entries). Everything else is gymnasium's CartPole-v1: the actions, the
reward of 1 a step, the end when the pole falls or the cart leaves the track, and the cut at 500 steps.
A policy needs a memory to balance it (rlfarm.envs.shipped.masked_velocity); a feed-forward one is
the baseline a recurrent policy is measured against:

    rlfarm train --preset cartpole-ppo --env rlfarm/cartpole_no_vel
"""

from __future__ import annotations

from typing import Any

from rlfarm.envs.shipped.masked_velocity import MaskVelocity, masked

BASE = "CartPole-v1"


def env(render_mode: str | None = None, **kwargs: Any) -> MaskVelocity:
    return masked(BASE, render_mode, **kwargs)

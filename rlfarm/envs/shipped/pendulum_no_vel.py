"""Pendulum-v1 without its angular velocity, rl-baselines3-zoo's `PendulumNoVel-v1`: the observation
is the cosine and sine of the angle, with the angular velocity at 0 (the observation keeps its 3
entries). Everything else is gymnasium's Pendulum-v1: the torque in [-2, 2], the reward, and the cut
at 200 steps (it never terminates). A policy needs a memory to swing it up
(rlfarm.envs.shipped.masked_velocity); a feed-forward one is the baseline:

    rlfarm train --preset pendulum-sac --env rlfarm/pendulum_no_vel
"""

from __future__ import annotations

from typing import Any

from rlfarm.envs.shipped.masked_velocity import MaskVelocity, masked

BASE = "Pendulum-v1"


def env(render_mode: str | None = None, **kwargs: Any) -> MaskVelocity:
    return masked(BASE, render_mode, **kwargs)

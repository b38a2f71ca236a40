"""Envs whose step costs wall time but no CPU: a simulator running on a machine of its own, on a
machine with fewer cores than workers. Used by benchmarks/appo.py (`--env benchmarks.slow_envs:...`)."""

from __future__ import annotations

import time

import gymnasium as gym


class Sleepy(gym.Wrapper):
    """Sleeps `seconds` in every step before stepping the env."""

    def __init__(self, env: gym.Env, seconds: float):
        super().__init__(env)
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)


def cartpole_sleepy() -> gym.Env:
    """CartPole-v1 at 0.25 ms a step: a 4 x 512-step task takes about 0.5 s, ten times a PPO update."""
    return Sleepy(gym.make("CartPole-v1"), 0.00025)

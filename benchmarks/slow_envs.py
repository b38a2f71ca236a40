"""Envs whose step costs wall time but no CPU: a simulator running on a machine of its own, on a
machine with fewer cores than workers. Used by benchmarks/appo.py and scale.py
(`--env benchmarks.slow_envs:...`); `frames` gives task_cost.py Atari-shaped results without ale_py."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


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


def cartpole_sleep_4ms() -> gym.Env:
    """CartPole-v1 at 4 ms a step (benchmarks/scale.py's default). Back to back the policy and
    CartPole take ~45 us a step; after each sleep ~0.2-0.3 ms (see cartpole_sleep_16ms)."""
    return Sleepy(gym.make("CartPole-v1"), 0.004)


def cartpole_sleep_16ms() -> gym.Env:
    """CartPole-v1 at 16 ms a step: on this project's 2-core VM a step after a sleep costs ~0.2-0.3 ms
    of CPU (caches gone cold) however long the sleep, so fewer, longer steps make a task of the same
    length nearly free of CPU (4 steps: a 64 ms task)."""
    return Sleepy(gym.make("CartPole-v1"), 0.016)


def cartpole_sleep_1ms() -> gym.Env:
    """CartPole-v1 at 1 ms a step: ~4% of a core per process in the policy and the env."""
    return Sleepy(gym.make("CartPole-v1"), 0.001)


class Frames(gym.Env):
    """Atari-shaped observations without ale_py: 4 stacked 84x84 uint8 frames of a bar moving a pixel
    a step (consecutive observations share 3 frames, as frame stacks do), 6 actions, 500-step episodes."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        self.action_space = gym.spaces.Discrete(6)
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros((4, 84, 84), np.uint8)
        for k in range(4):
            obs[k, :, (self.t + k) % 84] = 255
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = int(self.np_random.integers(84))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t % 21 == 0), False, self.t % 500 == 0, {}


def frames() -> gym.Env:
    return Frames()

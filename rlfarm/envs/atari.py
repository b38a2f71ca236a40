"""Atari on the workers: DeepMind's preprocessing (Mnih et al. 2015; Machado et al. 2018 for the
evaluation caveats) as gymnasium wrappers. PURE: no Redis, no Celery.

    ALE/Pong-v5 (frameskip=1)
      -> AtariPreprocessing: up to `noop_max` no-op starts, frame skip 4 with max-pooling of the last
         two frames, 84x84 (`screen_size`) grayscale, uint8 (gymnasium's wrapper)
      -> LifeLossSignal (optional): a life lost is a terminal for learning, not an episode end
      -> RawScore: rewards clipped to their sign for learning; the real game score in info["raw_reward"]
      -> FrameStackObservation: the last `frame_stack` frames, (4, 84, 84) uint8, channels first

`rlfarm.core.rollout.collect` reports episode returns from info["raw_reward"] (the game score a paper
reports) and treats info["life_lost"] as a termination that does not reset the game: the episode,
and its score, go on until the game is over, as Stable-Baselines3's EpisodicLifeEnv does.

A task's vector of Atari envs is `rlfarm.envs.ale_vector.AleVector`, this chain's arithmetic over
ale-py's emulators with a state that can be saved and restored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.errors import EnvError

INSTALL_HINT = 'pip install -e ".[atari]" (ale-py ships the ROMs)'


def register() -> None:
    """Register the ALE ids with gymnasium (gymnasium >= 1.0 does not do it by itself)."""
    try:
        import ale_py
    except ImportError:
        raise EnvError(f"Atari envs need the atari extra: {INSTALL_HINT}") from None
    gym.register_envs(ale_py)


class LifeLossSignal(gym.Wrapper):
    """info["life_lost"] = True on a step that loses a life while the game goes on."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        info["life_lost"] = bool(lives < self.lives and not (terminated or truncated))
        self.lives = lives
        return obs, reward, terminated, truncated, info


class RawScore(gym.Wrapper):
    """Rewards clipped to {-1, 0, 1} for learning (`clip`), the real reward kept in info["raw_reward"]."""

    def __init__(self, env: gym.Env, clip: bool = True):
        super().__init__(env)
        self.clip = clip

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["raw_reward"] = float(reward)
        return obs, float(np.sign(reward)) if self.clip else float(reward), terminated, truncated, info


def wrap(env: gym.Env, options: Mapping[str, Any]) -> gym.Env:
    """The preprocessing chain above on an ALE env made with frameskip=1."""
    try:
        import cv2  # noqa: F401 - AtariPreprocessing resizes with OpenCV
    except ImportError:
        raise EnvError(f"Atari preprocessing needs OpenCV: {INSTALL_HINT}") from None
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=int(options.get("noop_max", 30)),
        frame_skip=4,
        screen_size=screen_size(options),
        grayscale_obs=True,
        scale_obs=False,
    )
    if options.get("terminal_on_life_loss", False):
        env = LifeLossSignal(env)
    env = RawScore(env, clip=bool(options.get("clip_rewards", True)))
    return gym.wrappers.FrameStackObservation(env, int(options.get("frame_stack", 4)))


SCREEN_SIZE = 84  # DeepMind's; `env.screen_size` = 42 is the small input RLlib's APPO solves Pong with


def screen_size(options: Mapping[str, Any]) -> int:
    return int(options.get("screen_size", SCREEN_SIZE))

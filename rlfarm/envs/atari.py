"""Atari on the workers: DeepMind's preprocessing (Mnih et al. 2015; Machado et al. 2018 for the
evaluation caveats) as gymnasium wrappers. PURE: no Redis, no Celery.

    ALE/Pong-v5 (frameskip=1)
      -> AtariPreprocessing: up to `noop_max` no-op starts, frame skip 4 with max-pooling of the last
         two frames, 84x84 grayscale, uint8 (gymnasium's wrapper)
      -> LifeLossSignal (optional): a life lost is a terminal for learning, not an episode end
      -> RawScore: rewards clipped to their sign for learning; the real game score in info["raw_reward"]
      -> FrameStackObservation: the last `frame_stack` frames, (4, 84, 84) uint8, channels first

`rlfarm.core.rollout.collect` reports episode returns from info["raw_reward"] (the game score a paper
reports) and treats info["life_lost"] as a termination that does not reset the game: the episode,
and its score, go on until the game is over, as Stable-Baselines3's EpisodicLifeEnv does.

A task's vector of Atari envs is `NativeVector` where ale-py has one (0.11 and later): the same chain
run inside ale-py's C++ library (the frames are the wrapper chain's, bit for bit, after the first
stacked reset frame; tests/test_atari.py), without a Python call per emulated frame, so faster than
the wrapper chain on one core (benchmarks/throughput.py). Single envs (evaluation episodes,
`rlfarm eval`) keep the wrappers.
"""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np

from rlfarm.envs.errors import EnvError

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
    env = gym.wrappers.AtariPreprocessing(env, noop_max=int(options.get("noop_max", 30)), frame_skip=4,
                                          screen_size=84, grayscale_obs=True, scale_obs=False)
    if options.get("terminal_on_life_loss", False):
        env = LifeLossSignal(env)
    env = RawScore(env, clip=bool(options.get("clip_rewards", True)))
    return gym.wrappers.FrameStackObservation(env, int(options.get("frame_stack", 4)))


def native_vector_available() -> bool:
    try:
        from ale_py import vector_env  # noqa: F401
    except ImportError:
        return False
    return True


class NativeVector(gym.vector.VectorEnv):
    """ale-py's vector env (frame skip 4 with max-pooling, 84x84 grayscale, frame stack, no-op
    starts, all in C++, one thread: a worker process keeps to its core) behind the wrapper chain's
    contract: its spaces, SAME_STEP autoreset with info["final_obs"], info["raw_reward"] (the game
    score), info["life_lost"] with `terminal_on_life_loss`, rewards clipped to their sign with
    `clip_rewards`. Sticky actions, the action set and the episode cap are the registered id's."""

    def __init__(self, env_id: str, num_envs: int, options: Mapping[str, Any]):
        from ale_py.vector_env import AtariVectorEnv

        registered = gym.registry[env_id].kwargs
        self.ale = AtariVectorEnv(
            registered["game"], num_envs, num_threads=1, autoreset_mode="SameStep",
            repeat_action_probability=float(registered.get("repeat_action_probability", 0.25)),
            full_action_space=bool(registered.get("full_action_space", False)),
            max_num_frames_per_episode=int(registered.get("max_num_frames_per_episode", 108_000)),
            img_height=84, img_width=84, grayscale=True, stack_num=int(options.get("frame_stack", 4)),
            frameskip=4, maxpool=True, noop_max=int(options.get("noop_max", 30)), episodic_life=False,
            reward_clipping=False, use_fire_reset=False)
        self.num_envs = num_envs
        self.single_observation_space = self.ale.single_observation_space
        self.single_action_space = self.ale.single_action_space
        self.observation_space = self.ale.observation_space
        self.action_space = self.ale.action_space
        self.clip = bool(options.get("clip_rewards", True))
        self.signal_life_loss = bool(options.get("terminal_on_life_loss", False))
        self.lives = np.zeros(num_envs, np.int64)

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:  # the library takes 31-bit seeds; rlfarm's are 32-bit (rollout.task_seeds)
            seed = np.arange(seed, seed + self.num_envs) if isinstance(seed, int) else np.asarray(seed, np.int64)
            seed = seed % (2 ** 31 - 1)
        obs, info = self.ale.reset(seed=seed)
        self.lives = np.array(info["lives"], np.int64)
        return np.array(obs), {}  # a copy: the library may reuse its buffer on the next step

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated, info = self.ale.step(np.asarray(actions, np.int64))
        raw = np.asarray(reward, np.float32)
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        per_step: dict[str, np.ndarray] = {"raw_reward": raw}
        if self.signal_life_loss:
            lives = np.array(info["lives"], np.int64)  # an ended game's row holds its reset's lives
            per_step["life_lost"] = (lives < self.lives) & ~(terminated | truncated)
            self.lives = lives
        # Where an episode ended, SAME_STEP readers take the step's own values from final_info.
        out: dict[str, Any] = {**per_step, "final_info": per_step}
        if "final_obs" in info:
            out["final_obs"] = np.array(info["final_obs"])
        return np.array(obs), (np.sign(raw) if self.clip else raw), terminated, truncated, out

    def close(self, **kwargs: Any) -> None:
        self.ale.close()

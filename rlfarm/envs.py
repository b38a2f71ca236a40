"""Environment construction: gymnasium ids or "module:callable", vector envs, space descriptions."""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv


class EnvError(ValueError):
    """An env id that cannot be made, or spaces rlfarm cannot act in."""


def _factory(env_id: str) -> Callable[[], gym.Env]:
    if env_id in gym.registry:
        return lambda: gym.make(env_id)
    if ":" in env_id:
        module_name, _, attr = env_id.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise EnvError(f"env {env_id!r}: cannot import module {module_name!r}: {exc}") from None
        if env_id in gym.registry:  # importing the module may have registered it
            return lambda: gym.make(env_id)
        target = getattr(module, attr, None)
        if target is None:
            raise EnvError(f"env {env_id!r}: module {module_name!r} has no attribute {attr!r}")
        if callable(target):  # an Env class or a factory function
            return target
        raise EnvError(f"env {env_id!r}: {attr!r} is not callable")
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise EnvError(f"unknown env {env_id!r}{hint} (give a gymnasium id or 'module:callable')")


def make_env(env_id: str) -> gym.Env:
    return _factory(env_id)()


def make_vector_env(env_id: str, num_envs: int) -> SyncVectorEnv:
    """Sub-envs in this process, with SAME_STEP autoreset.

    gymnasium >= 1.0 defaults to NEXT_STEP autoreset: the step after an episode ends is a reset whose
    action is ignored. SAME_STEP instead resets inside the ending step and hands the real final
    observation over in info["final_obs"], which is what truncation bootstrapping needs.
    """
    factory = _factory(env_id)
    return SyncVectorEnv([factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


@dataclass(frozen=True)
class SpaceSpec:
    """What a network needs to know about an env: flat observation size and the action space."""

    obs_dim: int
    discrete: bool
    action_dim: int  # number of actions if discrete, else the Box dimension
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"obs_dim": self.obs_dim, "discrete": self.discrete, "action_dim": self.action_dim,
                "action_low": list(self.action_low), "action_high": list(self.action_high)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpaceSpec":
        return cls(int(d["obs_dim"]), bool(d["discrete"]), int(d["action_dim"]),
                   tuple(d["action_low"]), tuple(d["action_high"]))


def space_spec(env: gym.Env) -> SpaceSpec:
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise EnvError(f"observation space {obs_space} is not supported (Box only)")
    obs_dim = int(np.prod(obs_space.shape))
    if isinstance(act_space, gym.spaces.Discrete):
        return SpaceSpec(obs_dim, True, int(act_space.n))
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return SpaceSpec(obs_dim, False, int(act_space.shape[0]),
                         tuple(float(x) for x in act_space.low), tuple(float(x) for x in act_space.high))
    raise EnvError(f"action space {act_space} is not supported (Discrete or 1-D Box)")


def describe(env_id: str) -> SpaceSpec:
    """Make the env once to read its spaces; also the check that the id is valid."""
    env = make_env(env_id)
    try:
        return space_spec(env)
    finally:
        env.close()

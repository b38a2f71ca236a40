"""What a network and a rollout need to know about an env's spaces (`SpaceSpec`), read once from a
made env (`describe`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlfarm.envs.agents import AgentVector
from rlfarm.envs.make import make_env
from rlfarm.envs.turns import TurnVector
from rlfarm.errors import EnvError

OBS_DTYPES = ("float32", "uint8")  # what observations are kept as (see SpaceSpec)


@dataclass(frozen=True)
class SpaceSpec:
    """What a network and a rollout need to know about an env's spaces.

    Observations keep their shape and one of two dtypes end to end (env -> rollout -> result ->
    replay -> minibatch): uint8 stays uint8 (images: 4x smaller than float32 on the wire and in
    replay, scaled to [0, 1] inside the network), everything else is cast once, in `collect`, to
    float32 (float64 envs included). A uint8 observation of three dimensions is an image, laid out
    HWC or CHW (`image_layout`); anything else is a vector (flattened if it has more dimensions).
    """

    obs_dim: int  # number of observation values (the product of obs_shape)
    discrete: bool
    action_dim: int  # number of actions if discrete, else the Box dimension
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    obs_shape: tuple[int, ...] = ()  # () means (obs_dim,)
    obs_dtype: str = "float32"  # "float32" or "uint8"
    # Agents of a multi-agent env (rlfarm.envs.agents): each game fills this many sub-envs, one per
    # agent, all acted for by one policy; 1 for a single-agent env.
    agents: int = 1
    # The env says which actions are legal at each observation (info["action_mask"], (N, action_dim)
    # bool): actors choose among them and learners score only them. Discrete actions only.
    action_mask: bool = False
    # Seats of a turn-based game (rlfarm.envs.turns): the learner plays one, opponents the others
    # (self-play, rlfarm.core.league); 1 for any other env.
    seats: int = 1
    # Several policies (env.policy_map, rlfarm.algos.group): their names in the map's order, the index
    # of each agent's policy in that tuple, and each agent's own observation size (observations are
    # zero-padded to obs_dim, the largest, so agents of different spaces share a rollout's arrays).
    policies: tuple[str, ...] = ()
    agent_policy: tuple[int, ...] = ()
    agent_obs_dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.obs_shape:
            object.__setattr__(self, "obs_shape", (int(self.obs_dim),))
        if self.obs_dtype not in OBS_DTYPES:
            raise EnvError(f"observation dtype {self.obs_dtype!r} is not supported ({', '.join(OBS_DTYPES)})")

    def policy_spec(self, name: str) -> SpaceSpec:
        """The spaces policy `name` acts in: its agents' own observation size, one agent a sub-env."""
        index = self.policies.index(name)
        dims = {d for d, p in zip(self.agent_obs_dims, self.agent_policy) if p == index}
        (dim,) = dims
        return dataclasses.replace(
            self, obs_dim=dim, obs_shape=(dim,), agents=1, policies=(), agent_policy=(), agent_obs_dims=()
        )

    def columns(self, name: str, num_envs: int) -> np.ndarray:
        """The sub-envs of a vector of `num_envs` (games of `agents` agents) whose agent policy `name` acts for."""
        index = self.policies.index(name)
        agent = np.arange(num_envs) % self.agents
        return np.flatnonzero(np.asarray(self.agent_policy)[agent] == index)

    @property
    def is_image(self) -> bool:
        return self.obs_dtype == "uint8" and len(self.obs_shape) == 3

    @property
    def image_layout(self) -> str:
        """ "CHW" when the first axis looks like channels (at most 4 and smaller than the last), else "HWC"."""
        first, last = self.obs_shape[0], self.obs_shape[-1]
        return "CHW" if first <= 4 and first < last else "HWC"

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one action as stored: () for a discrete action, (action_dim,) for a Box."""
        return () if self.discrete else (self.action_dim,)

    @property
    def action_dtype(self) -> str:
        return "int64" if self.discrete else "float32"

    def to_dict(self) -> dict[str, Any]:
        return {
            "obs_dim": self.obs_dim,
            "obs_shape": list(self.obs_shape),
            "obs_dtype": self.obs_dtype,
            "discrete": self.discrete,
            "action_dim": self.action_dim,
            "action_low": list(self.action_low),
            "action_high": list(self.action_high),
            **({"agents": self.agents} if self.agents != 1 else {}),
            **({"action_mask": True} if self.action_mask else {}),
            **({"seats": self.seats} if self.seats != 1 else {}),
            **(
                {
                    "policies": list(self.policies),
                    "agent_policy": list(self.agent_policy),
                    "agent_obs_dims": list(self.agent_obs_dims),
                }
                if self.policies
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpaceSpec:
        return cls(
            int(d["obs_dim"]),
            bool(d["discrete"]),
            int(d["action_dim"]),
            tuple(d["action_low"]),
            tuple(d["action_high"]),
            tuple(int(x) for x in d.get("obs_shape", ())),
            str(d.get("obs_dtype", "float32")),
            int(d.get("agents", 1)),
            bool(d.get("action_mask", False)),
            int(d.get("seats", 1)),
            tuple(str(p) for p in d.get("policies", ())),
            tuple(int(i) for i in d.get("agent_policy", ())),
            tuple(int(i) for i in d.get("agent_obs_dims", ())),
        )


def space_spec(env: gym.Env | AgentVector | TurnVector) -> SpaceSpec:
    if isinstance(env, TurnVector):  # the learner's seat; which actions are legal travels beside
        spec = space_spec_of(env.single_observation_space, env.single_action_space)
        return dataclasses.replace(spec, action_mask=env.masked, seats=env.k)
    if isinstance(env, AgentVector):  # one policy for every agent: the spaces of one agent
        spec = space_spec_of(env.single_observation_space, env.single_action_space)
        spec = dataclasses.replace(spec, action_mask=env.masked)
        if env.policy_of:  # several policies: observations padded to the largest
            return dataclasses.replace(
                spec,
                agents=env.k,
                policies=env.policy_names,
                agent_policy=tuple(env.policy_names.index(p) for p in env.policy_of),
                agent_obs_dims=env.agent_obs_dims,
            )
        return dataclasses.replace(spec, agents=env.k)
    return space_spec_of(env.observation_space, env.action_space)


def space_spec_of(obs_space: gym.Space, act_space: gym.Space) -> SpaceSpec:
    if not isinstance(obs_space, gym.spaces.Box):
        raise EnvError(
            f"observation space {obs_space} is not supported: rlfarm acts on Box observations "
            f"(vectors, or HxWxC / CxHxW uint8 images); wrap the env to flatten "
            f"{type(obs_space).__name__} observations into a Box"
        )
    shape = tuple(int(x) for x in obs_space.shape)
    if not shape or 0 in shape:
        raise EnvError(f"observation space {obs_space} is not supported: it holds no values")
    obs_dtype = "uint8" if obs_space.dtype == np.uint8 else "float32"
    if not (obs_dtype == "uint8" and len(shape) == 3):
        shape = (int(np.prod(shape)),)  # vectors (and anything that is not an image) are flattened
    obs = {"obs_shape": shape, "obs_dtype": obs_dtype}
    obs_dim = int(np.prod(shape))
    if isinstance(act_space, gym.spaces.Discrete):
        return SpaceSpec(obs_dim, True, int(act_space.n), **obs)
    if isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        return SpaceSpec(
            obs_dim,
            False,
            int(act_space.shape[0]),
            tuple(float(x) for x in act_space.low),
            tuple(float(x) for x in act_space.high),
            **obs,
        )
    raise EnvError(f"action space {act_space} is not supported (Discrete or 1-D Box)")


def describe(env_id: str, options: Mapping[str, Any] | None = None) -> SpaceSpec:
    """Make the env once (with the run's preprocessing `options`) to read its spaces; also the check
    that the id is valid."""
    env = make_env(env_id, options=options)
    try:
        return space_spec(env)
    finally:
        env.close()

"""Acting without torch (PURE: numpy): the actor of a version built from its saved tensors alone, for
an MLP policy of any algorithm and for a group of them (`env.policy_map`). Workers, `rlfarm eval` and
`rlfarm.load` act MLP policies through here and never import torch; a CNN's actor needs torch (or ONNX
Runtime on a graph torch exports), built from the network (`actor_snapshot`).

Each algorithm's package has an `acting` module (torch-free) with `numpy_actor(spec, config, state)`;
its `policies` module builds the same actor from a torch network's tensors, so the two cannot differ.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.acting import Actor


def policy_tensors(state: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Policy `name`'s network in a saved state: a group's `nets.<name>.` tensors, or, in a single
    policy's file (best_policy.<name>.safetensors, a one-policy run's), all of them."""
    prefix = f"nets.{name}."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)} or dict(state)


def acts_without_torch(spec: SpaceSpec) -> bool:
    """Whether `numpy_actor` can act for this spec: vector observations (MLPs), for every policy."""
    return not spec.is_image


@runtime_checkable
class ActingModule(Protocol):
    """What an algorithm's `acting` module (rlfarm/algos/<name>/acting.py, torch-free) provides."""

    HEAD: str  # the prefix of its network's action head in a saved state (rlfarm.algos.saved)

    def numpy_actor(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> Actor:
        """The actor of its MLP network for `spec`, from the saved tensors `state` (numpy arrays)."""


def acting_module(algo: str) -> ActingModule:
    """Algorithm `algo`'s torch-free `acting` module (ConfigError naming the known ones; TypeError
    naming what a module that does not keep the ActingModule contract lacks)."""
    from rlfarm.config import ALGORITHMS
    from rlfarm.errors import ConfigError

    if algo not in ALGORITHMS:
        raise ConfigError(f"unknown algo {algo!r}; available: {', '.join(sorted(ALGORITHMS))}")
    package = ALGORITHMS[algo].__module__.rpartition(".")[0]  # rlfarm.algos.<name>
    return checked_acting(importlib.import_module(f"{package}.acting"))


def checked_acting(module: Any) -> ActingModule:
    """`module` as an ActingModule, or TypeError naming what it lacks."""
    if not isinstance(module, ActingModule):
        lacks = [name for name in ("HEAD", "numpy_actor") if not hasattr(module, name)]
        raise TypeError(f"{module.__name__} is no acting module: it lacks {', '.join(lacks)} (rlfarm.algos.acting)")
    return module


def numpy_actor(algo: str, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> Actor:
    """The actor of algorithm `algo`'s MLP network for `spec` with the saved tensors `state` (numpy
    arrays; a group's under `nets.<policy>.`). Raises rlfarm.nn.acting.StateMismatch for tensors that
    are not that network, ValueError for spaces the algorithm cannot act in."""
    if not acts_without_torch(spec):
        raise ValueError("a CNN policy acts through torch: build its network (rlfarm.algos.network_for)")
    build = acting_module(algo).numpy_actor
    if not spec.policies:
        return build(spec, config, state)
    actors = {}
    for name in spec.policies:
        actors[name] = build(spec.policy_spec(name), config, policy_tensors(state, name))
    return GroupActor(spec, actors)


class GroupActor(Actor):
    """Each policy's actor on its own columns (and its own observation width)."""

    def __init__(self, spec: SpaceSpec, actors: Mapping[str, Actor]):
        self.spec = spec
        self.actors = dict(actors)
        self.widths = {name: spec.policy_spec(name).obs_dim for name in spec.policies}
        self._columns: dict[int, dict[str, np.ndarray]] = {}  # by vector size: collect asks at every step

    def with_options(self, **options: Any) -> GroupActor:
        return GroupActor(self.spec, {name: actor.with_options(**options) for name, actor in self.actors.items()})

    def _parts(self, n: int, rows: np.ndarray | None = None) -> list[tuple[Actor, np.ndarray, int]]:
        """Each policy's actor, the batch rows it acts for and its observation width. The batch is a
        whole vector of sub-envs, or the sub-envs `rows` (agent of row i: rows[i] mod agents)."""
        if rows is None:
            if n not in self._columns:
                self._columns[n] = {name: self.spec.columns(name, n) for name in self.spec.policies}
            columns = self._columns[n]
        else:
            policy_of_row = np.asarray(self.spec.agent_policy)[np.asarray(rows) % self.spec.agents]
            columns = {name: np.flatnonzero(policy_of_row == i) for i, name in enumerate(self.spec.policies)}
        return [(self.actors[name], columns[name], self.widths[name]) for name in self.spec.policies]

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(obs)
        actions = np.zeros((n, *self.spec.action_shape), self.spec.action_dtype)
        logprobs = np.zeros(n, np.float32)
        values = np.zeros(n, np.float32)
        for actor, cols, dim in self._parts(n):
            own = np.ascontiguousarray(obs[cols, :dim])
            if mask is None:
                a, lp, v = actor.act(own, rng, deterministic)
            else:
                a, lp, v = actor.act(own, rng, deterministic, mask=mask[cols])
            actions[cols], logprobs[cols], values[cols] = a, lp, v
        return actions, logprobs, values

    def value(self, obs: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """State values of a whole vector's observations, or of those of sub-envs `rows` (the real
        final observations of the sub-envs whose episodes were cut)."""
        values = np.zeros(len(obs), np.float32)
        for actor, cols, dim in self._parts(len(obs), rows):
            if len(cols):
                values[cols] = actor.value(np.ascontiguousarray(obs[cols, :dim]))
        return values

"""Policies saved to files (best_policy.safetensors, exports): the actor, or the network, a saved state
dict is, built for an env's spaces, and a clear `PolicyMismatch` when it does not fit them (PURE:
numpy; torch where a network is asked for, or a CNN acts).

A saved policy names its algorithm (`algo`), its network's output module (`head`) and the spaces it
was trained on (`space`, SpaceSpec.to_dict) in its metadata, so nothing has to be guessed from its
tensors. Files written before `space` was saved are read by their tensors' shapes, as they were then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfarm.algos import names, network_for
from rlfarm.algos.acting import acting_module, acts_without_torch, numpy_actor
from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.errors import PolicyMismatch, StateMismatch
from rlfarm.nn.acting import Actor

if TYPE_CHECKING:
    from torch import nn


def describe_policy(algo: str, spec: SpaceSpec) -> dict[str, str]:
    """What a published version's metadata says of its network: algorithm, head and spaces."""
    return {"algo": algo, "head": acting_module(algo).HEAD, "space": json.dumps(spec.to_dict(), sort_keys=True)}


def algo_of(meta: Mapping[str, str], state: Mapping[str, Any]) -> str:
    """The algorithm a saved policy names; for files that name none, the first whose output module's
    tensors it holds (the first registered if none matches)."""
    if meta.get("algo"):
        return meta["algo"]
    for name in names():
        if any(key.startswith(acting_module(name).HEAD + ".") for key in state):
            return name
    return names()[0]


def _actions(discrete: bool, n: int) -> str:
    return f"{n} discrete action{'s' if n != 1 else ''}" if discrete else f"{n}-dimensional continuous actions"


def _space_problems(saved: SpaceSpec, spec: SpaceSpec) -> list[str]:
    problems = []
    if saved.is_image != spec.is_image:
        kinds = ("images", "vectors")
        problems.append(
            f"it takes {kinds[not saved.is_image]} as observations, the env gives {kinds[not spec.is_image]}"
        )
    elif saved.obs_shape != spec.obs_shape:
        problems.append(
            f"it takes observations of shape {list(saved.obs_shape)}, the env's have shape {list(spec.obs_shape)}"
            if saved.is_image
            else f"it takes observations of size {saved.obs_dim}, the env's have size {spec.obs_dim}"
        )
    if saved.discrete != spec.discrete or saved.action_dim != spec.action_dim:
        problems.append(
            f"it acts with {_actions(saved.discrete, saved.action_dim)}, the env takes "
            f"{_actions(spec.discrete, spec.action_dim)}"
        )
    return problems


def _linear_shapes(state: Mapping[str, Any], head: str) -> list[tuple[int, ...]]:
    """Shapes of the Linear weights of the `head` MLP (`actor`, `q`) in a state dict, in order."""
    found = []
    for key, tensor in state.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == head and parts[1].isdigit() and parts[2] == "weight":
            found.append((int(parts[1]), tuple(tensor.shape)))
    return [shape for _, shape in sorted(found)]


def _inferred_problems(head: str, state: Mapping[str, Any], spec: SpaceSpec) -> list[str]:
    """For files without `space`: what the tensors' shapes say does not fit (written by PPO, DQN and
    SAC only, whose Gaussians all have an `actor_logstd`)."""
    problems = []
    saved_image = any(key.startswith("encoder.") for key in state)
    if saved_image != spec.is_image:
        kinds = ("images", "vectors")
        problems.append(f"it takes {kinds[not saved_image]} as observations, the env gives {kinds[not spec.is_image]}")
    layers = _linear_shapes(state, head)
    if layers and all(len(shape) == 2 for shape in layers):
        obs_dim, out = layers[0][1], layers[-1][0]
        discrete = not any(key.split(".")[0] == "actor_logstd" for key in state)
        if not saved_image and not spec.is_image and obs_dim != spec.obs_dim:
            problems.append(f"it takes observations of size {obs_dim}, the env's have size {spec.obs_dim}")
        if discrete != spec.discrete or out != spec.action_dim:
            problems.append(
                f"it acts with {_actions(discrete, out)}, the env takes {_actions(spec.discrete, spec.action_dim)}"
            )
    return problems


def _check_fits(algo: str, spec: SpaceSpec, state: Mapping[str, Any], meta: Mapping[str, str]) -> None:
    if algo not in names():
        raise PolicyMismatch(f"unknown algorithm {algo!r} in its metadata ({', '.join(names())})")
    if meta.get("space"):
        problems = _space_problems(SpaceSpec.from_dict(json.loads(meta["space"])), spec)
    else:
        problems = _inferred_problems(meta.get("head") or acting_module(algo).HEAD, state, spec)
    if problems:
        raise PolicyMismatch("; ".join(problems))


def _not_the_network(algo: str, exc: Exception) -> PolicyMismatch:
    detail = " ".join(str(exc).split())
    detail = detail if len(detail) <= 400 else detail[:400] + " ..."
    return PolicyMismatch(f"its tensors are not the {algo} network its metadata describes: {detail}")


def load_network(
    algo: str,
    spec: SpaceSpec,
    config: PolicyConfig,
    state: Mapping[str, Any],
    meta: Mapping[str, str] | None = None,
) -> nn.Module:
    """The network `algo` acts with, built for an env's `spec` and loaded with a saved `state` (torch
    tensors or numpy arrays; and the file's metadata `meta`, whose `space` says what it was trained
    on). Raises PolicyMismatch saying what does not fit (observation size, kind or number of actions)
    when the policy was trained on other spaces, or when its tensors are not the network its metadata
    describes."""
    import torch

    _check_fits(algo, spec, state, meta or {})
    tensors = {k: torch.from_numpy(v.copy()) if not isinstance(v, torch.Tensor) else v for k, v in state.items()}
    try:
        network = network_for(algo, spec, config)
        network.load_state_dict(tensors)
    except (RuntimeError, ValueError) as exc:  # tensors of another network (e.g. other hidden sizes)
        raise _not_the_network(algo, exc) from None
    return network


def load_actor(
    algo: str,
    spec: SpaceSpec,
    config: PolicyConfig,
    state: Mapping[str, Any],
    meta: Mapping[str, str] | None = None,
) -> Actor:
    """What acts with a saved policy for an env's `spec`, checked as `load_network` checks: an MLP's
    numpy actor straight from the tensors (no torch: rlfarm.algos.acting), a CNN's through its network."""
    _check_fits(algo, spec, state, meta or {})
    if acts_without_torch(spec) and all(isinstance(v, np.ndarray) for v in state.values()):
        try:
            return numpy_actor(algo, spec, config, state)
        except StateMismatch as exc:
            raise _not_the_network(algo, exc) from None
    from rlfarm.algos import learner

    return learner(algo).actor_snapshot(load_network(algo, spec, config, state, meta))

"""What workers act with, without torch (PURE: numpy): the `Actor` interface `rollout.collect` and
`rollout.run_episodes` call, MLPs as numpy steps read straight from a policy's saved tensors, and the
observation normaliser's arithmetic. A worker acting an MLP policy never imports torch (seconds of CPU
and a few hundred MB per process: benchmarks/startup.py); torch, ONNX Runtime and CNNs are in
rlfarm.nn.actors. Every actor samples from a numpy Generator, so a task is a pure function of
(weights, env seeds, action seed).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlfarm.envs import SpaceSpec
from rlfarm.errors import StateMismatch

EPS = 1e-8  # in the normaliser's sqrt(var + eps)

_NUMPY_ACTIVATIONS = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0)}


class Actor:
    """What `rollout.collect` and `rollout.run_episodes` act with: `act` and `value` on a batch of
    observations (shaped and typed as the spec says), and `with_options` for a task's acting options.

    A recurrent actor (`recurrent`: policy.recurrent) carries a state from one `act` to the next, one
    row per sub-env: set by `begin`, zeroed where episodes start (`episodes_started`), read back as
    `state`. `act` advances it, `value` does not. Feed-forward actors have none and ignore both calls."""

    spec: SpaceSpec
    recurrent = False
    seq_len = 0  # a recurrent actor's learning sequences, in steps (policy.seq_len; 0: a whole task)
    state: np.ndarray | None = None

    def begin(self, n: int, state: np.ndarray | None = None) -> None:
        """n episodes begin (`state` None), or go on from the state a stream saved (n rows)."""

    def episodes_started(self, rows: np.ndarray) -> None:
        """Episodes start anew at the batch rows `rows` (bool): their state goes back to zeros."""

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions, their log-probabilities and state values for a batch. `mask` (n, action_dim) bool:
        the legal actions (SpaceSpec.action_mask); an actor of discrete actions never picks another."""
        raise NotImplementedError

    def value(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def with_options(self, **options: Any) -> Actor:
        if options:
            raise ValueError(f"{type(self).__name__} takes no acting options, got {sorted(options)}")
        return self

    def _with(self, **attributes: Any) -> Actor:
        """A shallow copy acting with other options: the weights are shared, not copied."""
        other = copy.copy(self)
        other.__dict__.update(attributes)
        return other


class BoundedActor(Actor):
    """What an actor of continuous actions in a Box's bounds shares (SAC's and TD3's): the bounds, the
    unit-to-env scale and bias, the `random` option (heatup: uniform in the bounds), and values of 0
    (their critics are the learner's alone)."""

    random: bool = False

    def _bounds(self, spec: SpaceSpec) -> None:
        self.spec = spec
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self.scale, self.bias = action_scale_bias(spec)

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), np.float32)


def masked_sample(probs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row from `probs` (0 where illegal), by inverse CDF, never an illegal one: the first
    action whose CDF passes u, which has probability > 0 (u may be 0); rounding that lands past the
    last legal action takes the last legal one."""
    cdf = probs.cumsum(-1)
    u = rng.random((len(cdf), 1)) * cdf[:, -1:]
    action = np.minimum((cdf <= u).sum(-1), probs.shape[-1] - 1)
    rows = np.arange(len(action))
    wrong = ~mask[rows, action]
    if wrong.any():
        last_legal = probs.shape[-1] - 1 - mask[:, ::-1].argmax(-1)
        action[wrong] = last_legal[wrong]
    return action


def tensor(state: Mapping[str, np.ndarray], name: str, shape: Sequence[int]) -> np.ndarray:
    """`state[name]` as float32, checked to have `shape` (StateMismatch naming it otherwise)."""
    if name not in state:
        raise StateMismatch(f"no tensor {name!r} (tensors: {', '.join(sorted(state)[:8])}...)")
    value = np.asarray(state[name])
    if tuple(value.shape) != tuple(shape):
        raise StateMismatch(f"tensor {name!r} has shape {list(value.shape)}, the network's is {list(shape)}")
    return value.astype(np.float32)


def mlp_steps(state: Mapping[str, np.ndarray], prefix: str, sizes: Sequence[int], activation: str) -> list[Any]:
    """The MLP rlfarm.nn.layers.mlp(sizes, activation) builds, read from its saved tensors under
    `prefix` (`actor.0.weight`, `actor.0.bias`, `actor.2.weight`, ...): (W^T, b) pairs, with the
    activation between them, checked against `sizes`."""
    steps: list[Any] = []
    for i in range(len(sizes) - 1):
        index = 2 * i  # Linear, activation, Linear, ...: the Sequential's indices
        weight = tensor(state, f"{prefix}.{index}.weight", (sizes[i + 1], sizes[i]))
        steps.append((weight.T.copy(), tensor(state, f"{prefix}.{index}.bias", (sizes[i + 1],))))
        if i < len(sizes) - 2:
            steps.append(_NUMPY_ACTIVATIONS[activation])
    return steps


def linear_step(
    state: Mapping[str, np.ndarray], prefix: str, inputs: int, outputs: int
) -> tuple[np.ndarray, np.ndarray]:
    """One saved Linear layer `prefix` as (W^T, b)."""
    weight = tensor(state, f"{prefix}.weight", (outputs, inputs))
    return weight.T.copy(), tensor(state, f"{prefix}.bias", (outputs,))


def run_numpy_mlp(steps: list[Any], x: np.ndarray) -> np.ndarray:
    for step in steps:
        x = step(x) if callable(step) else x @ step[0] + step[1]
    return x


class NumpyNormalizer:
    """rlfarm.nn.normalize.ObsNormalizer's arithmetic in numpy for the workers' actors (float32, as the
    network's input): (obs - mean) / sqrt(var + eps), clipped to [-clip, clip]."""

    def __init__(self, mean: np.ndarray, var: np.ndarray, clip: float):
        self.mean = np.asarray(mean).astype(np.float32)
        self.std = np.sqrt(np.asarray(var) + EPS).astype(np.float32)
        self.clip = np.float32(clip)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        return np.clip((obs - self.mean) / self.std, -self.clip, self.clip)


def normalizer(state: Mapping[str, np.ndarray], spec: SpaceSpec, config: Any) -> NumpyNormalizer | None:
    """The saved observation normaliser (`obs_norm.mean`, `obs_norm.var`) where `policy.normalize_obs`
    builds one (rlfarm.nn.layers.obs_normalizer), else None."""
    if not (config.normalize_obs and not spec.is_image):
        return None
    if "obs_norm.mean" not in state or "obs_norm.var" not in state:
        raise StateMismatch("policy.normalize_obs is on but the tensors hold no obs_norm statistics")
    mean = np.asarray(state["obs_norm.mean"], np.float64)
    var = np.asarray(state["obs_norm.var"], np.float64)
    if mean.shape != (spec.obs_dim,) or var.shape != (spec.obs_dim,):
        raise StateMismatch(f"obs_norm statistics of shape {list(mean.shape)}, the observations' is [{spec.obs_dim}]")
    return NumpyNormalizer(mean, var, config.normalize_clip)


def action_scale_bias(spec: SpaceSpec) -> tuple[np.ndarray, np.ndarray]:
    """Half-range and midpoint of each action dimension (float64): env action = bias + scale * unit
    action, unit in [-1, 1]. Bounds may be asymmetric and differ per dimension."""
    low = np.asarray(spec.action_low, np.float64)
    high = np.asarray(spec.action_high, np.float64)
    return (high - low) / 2.0, (high + low) / 2.0

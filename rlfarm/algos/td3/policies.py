"""TD3's deterministic actor network and the actors workers act with (PURE: torch, numpy). Its twin
critics are rlfarm.nn.critics.ActionValueNetwork, which only its learner runs.

Actions have two scales: the *unit* action in [-1, 1]^dim, what the network's tanh gives and what the
critics and all of TD3's noises (exploration, target smoothing) are measured in, and the *env* action
bias + scale * unit, in the env's bounds (nn.layers.action_scale_bias; asymmetric bounds too).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.actors import Actor, numpy_mlp, run_numpy_mlp
from rlfarm.nn.layers import BoundedPolicy, NatureCNN, action_scale_bias, layer_init, mlp


class DeterministicPolicy(BoundedPolicy):
    """mu(s) = tanh(actor(features(s))) in unit scale, mapped to the env's bounds by `to_env`.

    `actor` is an MLP on the observation (on vectors), or one linear layer on a CNN encoder's features
    (on images): its first layer gives the observation size and its last the action size of a saved
    policy (rlfarm.algos.saved), as for PPO's and SAC's `actor`. The last layer starts near 0
    (orthogonal, std 0.01), so a fresh policy acts near the bounds' midpoints."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.discrete:
            raise ValueError("a deterministic tanh policy needs a Box action space")
        self.spec = spec
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.actor = nn.Sequential(layer_init(nn.Linear(self.encoder.features, spec.action_dim), std=0.01))
        else:
            self.encoder = None
            self.actor = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=0.01)
        self._bounds(spec, config)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic unit action mu(s), in [-1, 1]."""
        h = self.encoder(obs) if self.encoder is not None else self.normalize(obs)
        return torch.tanh(self.actor(h))

    def actor_snapshot(self) -> TD3Actor:
        return TorchTD3Actor(self) if self.encoder is not None else NumpyTD3Actor(self)


class TD3Actor(Actor):
    """Acts with TD3's deterministic policy: greedy, the env action bias + scale * mu(s); exploring
    (acting option `noise`, the std in unit scale), bias + scale * (mu(s) + N(0, noise)), clipped to
    the bounds; with the acting option `random` (heatup), uniformly in the bounds without the network.
    Noise comes from the task's numpy generator. Actions come back float32 and inside the bounds, so
    `collect`'s clip is a no-op and the rollout stores exactly what the env was given.
    Log-probabilities and values are 0: a deterministic policy has no density, and off-policy learning
    reads neither (the critics are the learner's alone)."""

    random: bool = False
    noise: float = 0.0

    def _bounds(self, spec: SpaceSpec) -> None:
        self.spec = spec
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self.scale, self.bias = action_scale_bias(spec)

    def unit_actions(self, obs: np.ndarray) -> np.ndarray:
        """mu(s) in [-1, 1] for a batch (float64)."""
        raise NotImplementedError

    def with_options(self, random: bool | None = None, noise: float | None = None, **options: Any) -> TD3Actor:
        """The same weights acting uniformly at random (heatup) or with another exploration noise (no
        copy of the weights)."""
        super().with_options(**options)
        changes: dict[str, Any] = {}
        if random is not None:
            changes["random"] = bool(random)
        if noise is not None:
            if not (np.isfinite(noise) and noise >= 0):
                raise ValueError(f"exploration noise must be a finite std, 0 or more, got {noise!r}")
            changes["noise"] = float(noise)
        return self._with(**changes) if changes else self

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), np.float32)

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, dim = len(obs), self.spec.action_dim
        if self.random and not deterministic:
            action = rng.uniform(self.low, self.high, (n, dim))
        else:
            unit = self.unit_actions(obs)
            if not deterministic and self.noise > 0:
                unit = np.clip(unit + self.noise * rng.standard_normal(unit.shape), -1.0, 1.0)
            action = self.bias + self.scale * unit
        # float32 rounding may step a hair outside a bound: clip here, so what is stored is what is sent.
        action = np.clip(action.astype(np.float32), self.low, self.high)
        return action, np.zeros(n, np.float32), np.zeros(n, np.float32)


class NumpyTD3Actor(TD3Actor):
    """A numpy snapshot of an MLP DeterministicPolicy (several times faster than torch per step)."""

    def __init__(self, policy: DeterministicPolicy):
        self._bounds(policy.spec)
        self.layers = numpy_mlp(policy.actor)
        self.normalize = policy.obs_norm.numpy() if policy.obs_norm is not None else None

    def unit_actions(self, obs: np.ndarray) -> np.ndarray:
        x = self.normalize(obs) if self.normalize is not None else obs
        return np.tanh(run_numpy_mlp(self.layers, x)).astype(np.float64)


class TorchTD3Actor(TD3Actor):
    """A CPU copy of a CNN DeterministicPolicy (workers run one torch thread per process)."""

    def __init__(self, policy: DeterministicPolicy):
        self._bounds(policy.spec)
        self.net = copy.deepcopy(policy).cpu().eval()

    @torch.no_grad()
    def unit_actions(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy().astype(np.float64)

"""TD3's actors without torch (PURE: numpy): acting with the deterministic policy and its exploration
noise, and the numpy actor of an MLP `DeterministicPolicy` (rlfarm.algos.td3.policies), built from its
saved tensors alone, so a worker acting it never imports torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.acting import BoundedActor, mlp_steps, normalizer, run_numpy_mlp

HEAD = "actor"  # the output MLP of a saved policy: its sizes are read from it (rlfarm.algos.saved)


class TD3Actor(BoundedActor):
    """Acts with TD3's deterministic policy: greedy, the env action bias + scale * mu(s); exploring
    (acting option `noise`, the std in unit scale), bias + scale * (mu(s) + N(0, noise)), clipped to
    the bounds; with the acting option `random` (heatup), uniformly in the bounds without the network.
    Noise comes from the task's numpy generator. Actions come back float32 and inside the bounds, so
    `collect`'s clip is a no-op and the rollout stores exactly what the env was given.
    Log-probabilities and values are 0: a deterministic policy has no density, and off-policy learning
    reads neither (the critics are the learner's alone)."""

    noise: float = 0.0

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
    """An MLP DeterministicPolicy's `actor.*` and `obs_norm.*` tensors as numpy steps (several times
    faster than torch per step)."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]):
        if spec.discrete:
            raise ValueError("a deterministic tanh policy needs a Box action space")
        self._bounds(spec)
        self.layers = mlp_steps(
            state, "actor", [spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation
        )
        self.normalize = normalizer(state, spec, config)

    def unit_actions(self, obs: np.ndarray) -> np.ndarray:
        x = self.normalize(obs) if self.normalize is not None else obs
        return np.tanh(run_numpy_mlp(self.layers, x)).astype(np.float64)


def numpy_actor(spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> NumpyTD3Actor:
    return NumpyTD3Actor(spec, config, state)

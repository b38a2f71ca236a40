"""TD3's deterministic actor network and the actors workers act with (PURE: torch, numpy). Its twin
critics are rlfarm.nn.critics.ActionValueNetwork, which only its learner runs.

Actions have two scales: the *unit* action in [-1, 1]^dim, what the network's tanh gives and what the
critics and all of TD3's noises (exploration, target smoothing) are measured in, and the *env* action
bias + scale * unit, in the env's bounds (nn.layers.action_scale_bias; asymmetric bounds too).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from rlfarm.algos.td3.acting import NumpyTD3Actor, TD3Actor
from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.actors import numpy_state
from rlfarm.nn.layers import BoundedPolicy, NatureCNN, layer_init, mlp


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
        self.spec, self.config = spec, config
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
        return (
            TorchTD3Actor(self)
            if self.encoder is not None
            else NumpyTD3Actor(self.spec, self.config, numpy_state(self))
        )


class TorchTD3Actor(TD3Actor):
    """A CPU copy of a CNN DeterministicPolicy (workers run one torch thread per process)."""

    def __init__(self, policy: DeterministicPolicy):
        self._bounds(policy.spec)
        self.net = copy.deepcopy(policy).cpu().eval()

    @torch.no_grad()
    def unit_actions(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy().astype(np.float64)

"""Critics of continuous actions (PURE: torch): Q(s, a), shared by the off-policy actor-critics (SAC, TD3)."""

from __future__ import annotations

import torch
from torch import nn

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.layers import NatureCNN, mlp


class ActionValueNetwork(nn.Module):
    """A critic Q(s, a) for Box actions given in unit scale [-1, 1] (whatever the env's bounds, so
    wide or shifted bounds do not skew the input): an MLP on the observation, or on its CNN features,
    concatenated with the action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.discrete:
            raise ValueError("an action-value network of continuous actions takes Box actions")
        self.spec = spec
        self.encoder = NatureCNN(spec, config) if spec.is_image else None
        features = self.encoder.features if self.encoder is not None else spec.obs_dim
        self.q = mlp([features + spec.action_dim, *config.hidden_sizes, 1], config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor, unit_action: torch.Tensor) -> torch.Tensor:
        x = self.encoder(obs) if self.encoder is not None else obs
        return self.q(torch.cat([x, unit_action], -1)).squeeze(-1)

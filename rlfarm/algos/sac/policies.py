"""SAC's networks and the actors workers act with (PURE: torch, numpy): a tanh-squashed Gaussian
policy scaled to the env's bounds, and soft Q-networks on (observation, unit action) that only its
learner runs."""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfarm.algos.sac.acting import NumpySACActor, SACActor, log_std_from_tanh
from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.actors import numpy_state
from rlfarm.nn.layers import BoundedPolicy, NatureCNN, layer_init, mlp


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2), elementwise, as 2 (log 2 - u - softplus(-2u)): the same identity, exact
    where 1 - tanh(u)^2 rounds to 0 in float32 (|u| > ~9) and needs no epsilon."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


class SquashedGaussianPolicy(BoundedPolicy):
    """SAC's policy: u ~ N(mean(s), std(s)) and the action a = bias + scale * tanh(u), in the env's
    bounds. `actor` is the mean's MLP (its last layer the mean head), `actor_logstd` a second head on
    the same features, so a saved policy reads like PPO's for rlfarm.algos.saved.load_network (observation
    size from the first layer, action size from the last). Images: a CNN encoder, then both heads.

    Log-probabilities are of the unit action tanh(u) in [-1, 1] (as SB3's): the scaling to the bounds
    is a constant shift, left out so the target entropy -action_dim means the same for any bounds."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if spec.discrete:
            raise ValueError("a squashed Gaussian policy needs a Box action space")
        self.spec, self.config = spec, config
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            features = self.encoder.features
            self.actor = nn.Sequential(layer_init(nn.Linear(features, spec.action_dim), std=0.01))
        else:
            self.encoder = None
            features = config.hidden_sizes[-1]
            self.actor = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=0.01)
        self.actor_logstd = layer_init(nn.Linear(features, spec.action_dim), std=0.01)
        self._bounds(spec, config)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian's mean and log-std over pre-squash actions u."""
        h = self.encoder(obs) if self.encoder is not None else self.normalize(obs)
        h = self.actor[:-1](h)  # the shared hidden layers (none for images: the encoder's features)
        return self.actor[-1](h), log_std_from_tanh(torch.tanh(self.actor_logstd(h)))

    def sample(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised unit actions tanh(u) and their log-probabilities
        log N(u; mean, std) - sum log(1 - tanh(u)^2). Noise from `generator`: a learner's private
        stream, so a checkpoint can hold it."""
        mean, log_std = self(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        u = mean + log_std.exp() * noise
        # (u - mean) / std is the noise itself: no division, no rounding.
        normal = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
        return torch.tanh(u), (normal - tanh_log_det(u)).sum(-1)

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action in unit scale, tanh(mean)."""
        return torch.tanh(self(obs)[0])

    def actor_snapshot(self) -> SACActor:
        return (
            TorchSACActor(self)
            if self.encoder is not None
            else NumpySACActor(self.spec, self.config, numpy_state(self))
        )


class TorchSACActor(SACActor):
    """A CPU copy of a CNN SquashedGaussianPolicy (workers run one torch thread per process)."""

    def __init__(self, policy: SquashedGaussianPolicy):
        self._bounds(policy.spec)
        self.net = copy.deepcopy(policy).cpu().eval()

    @torch.no_grad()
    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, log_std = self.net(torch.from_numpy(np.ascontiguousarray(obs)))
        return mean.numpy().astype(np.float64), log_std.numpy().astype(np.float64)

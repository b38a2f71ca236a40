"""SAC's networks and the actors workers act with (PURE: torch, numpy): a tanh-squashed Gaussian
policy scaled to the env's bounds, and soft Q-networks on (observation, unit action) that only its
learner runs."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.actors import Actor, numpy_mlp, run_numpy_mlp
from rlfarm.nn.layers import BoundedPolicy, NatureCNN, action_scale_bias, layer_init, mlp

# The Gaussian's log-std is squashed into this range by a tanh (as CleanRL does): smooth, where a clamp
# would cut the gradient off at the edges.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def log_std_from_tanh(t: Any) -> Any:
    """tanh of the log-std head's output (in [-1, 1]) -> the log-std, in [LOG_STD_MIN, LOG_STD_MAX]."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (t + 1.0)


def tanh_log_det(u: torch.Tensor) -> torch.Tensor:
    """log(1 - tanh(u)^2), elementwise, as 2 (log 2 - u - softplus(-2u)): the same identity, exact
    where 1 - tanh(u)^2 rounds to 0 in float32 (|u| > ~9) and needs no epsilon."""
    return 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))


def np_tanh_log_det(u: np.ndarray) -> np.ndarray:
    """tanh_log_det in numpy (softplus(x) = logaddexp(0, x)), for the workers."""
    return 2.0 * (np.log(2.0) - u - np.logaddexp(0.0, -2.0 * u))


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
        self.spec = spec
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
        return TorchSACActor(self) if self.encoder is not None else NumpySACActor(self)


class SACActor(Actor):
    """Acts with SAC's squashed Gaussian from a numpy generator: a = bias + scale * tanh(u),
    u ~ N(mean, std); greedy: bias + scale * tanh(mean). With the acting option `random` (heatup) it
    acts uniformly in the bounds without the network. Actions come back float32 and clipped to the
    bounds, so `collect`'s clip is a no-op and the rollout stores exactly what the env was given.
    Log-probabilities are of the unit action (see SquashedGaussianPolicy); values are 0 (SAC's
    critics are the learner's alone)."""

    random: bool = False

    def _bounds(self, spec: SpaceSpec) -> None:
        self.spec = spec
        self.low = np.asarray(spec.action_low, np.float32)
        self.high = np.asarray(spec.action_high, np.float32)
        self.scale, self.bias = action_scale_bias(spec)

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mean and log-std of u for a batch (float64)."""
        raise NotImplementedError

    def with_options(self, random: bool | None = None, **options: Any) -> SACActor:
        """The same weights acting uniformly at random (heatup) or from the policy (no copy of the weights)."""
        super().with_options(**options)
        return self if random is None else self._with(random=bool(random))

    def value(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), np.float32)

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, dim = len(obs), self.spec.action_dim
        if self.random and not deterministic:
            action = rng.uniform(self.low, self.high, (n, dim))
            logprob = np.full(n, -dim * np.log(2.0))  # the uniform density on [-1, 1]^dim
        else:
            mean, log_std = self.gaussian(obs)
            noise = np.zeros_like(mean) if deterministic else rng.standard_normal(mean.shape)
            u = mean + np.exp(log_std) * noise
            logprob = (-0.5 * noise * noise - log_std - 0.5 * np.log(2 * np.pi) - np_tanh_log_det(u)).sum(-1)
            action = self.bias + self.scale * np.tanh(u)
        # float32 rounding may step a hair outside a bound: clip here, so what is stored is what is sent.
        action = np.clip(action.astype(np.float32), self.low, self.high)
        return action, logprob.astype(np.float32), np.zeros(n, np.float32)


class NumpySACActor(SACActor):
    """A numpy snapshot of an MLP SquashedGaussianPolicy (several times faster than torch per step)."""

    def __init__(self, policy: SquashedGaussianPolicy):
        self._bounds(policy.spec)
        steps = numpy_mlp(policy.actor)
        self.hidden, self.mean_head = steps[:-1], steps[-1]
        (self.logstd_head,) = numpy_mlp(nn.Sequential(policy.actor_logstd))
        self.normalize = policy.obs_norm.numpy() if policy.obs_norm is not None else None

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = run_numpy_mlp(self.hidden, self.normalize(obs) if self.normalize is not None else obs)
        mean = h @ self.mean_head[0] + self.mean_head[1]
        log_std = log_std_from_tanh(np.tanh(h @ self.logstd_head[0] + self.logstd_head[1]))
        return mean.astype(np.float64), log_std.astype(np.float64)


class TorchSACActor(SACActor):
    """A CPU copy of a CNN SquashedGaussianPolicy (workers run one torch thread per process)."""

    def __init__(self, policy: SquashedGaussianPolicy):
        self._bounds(policy.spec)
        self.net = copy.deepcopy(policy).cpu().eval()

    @torch.no_grad()
    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, log_std = self.net(torch.from_numpy(np.ascontiguousarray(obs)))
        return mean.numpy().astype(np.float64), log_std.numpy().astype(np.float64)

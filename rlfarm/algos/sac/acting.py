"""SAC's actors without torch (PURE: numpy): acting with the tanh-squashed Gaussian, and the numpy
actor of an MLP `SquashedGaussianPolicy` (rlfarm.algos.sac.policies), built from its saved tensors
alone, so a worker acting it never imports torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.acting import BoundedActor, linear_step, mlp_steps, normalizer, run_numpy_mlp

# The Gaussian's log-std is squashed into this range by a tanh (as CleanRL does): smooth, where a clamp
# would cut the gradient off at the edges.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def log_std_from_tanh(t: Any) -> Any:
    """tanh of the log-std head's output (in [-1, 1]) -> the log-std, in [LOG_STD_MIN, LOG_STD_MAX]."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (t + 1.0)


def np_tanh_log_det(u: np.ndarray) -> np.ndarray:
    """log(1 - tanh(u)^2) in numpy (softplus(x) = logaddexp(0, x)), for the workers; the torch
    learner's is rlfarm.algos.sac.policies.tanh_log_det."""
    return 2.0 * (np.log(2.0) - u - np.logaddexp(0.0, -2.0 * u))


HEAD = "actor"  # the output MLP of a saved policy: its sizes are read from it (rlfarm.algos.saved)


class SACActor(BoundedActor):
    """Acts with SAC's squashed Gaussian from a numpy generator: a = bias + scale * tanh(u),
    u ~ N(mean, std); greedy: bias + scale * tanh(mean). With the acting option `random` (heatup) it
    acts uniformly in the bounds without the network. Actions come back float32 and clipped to the
    bounds, so `collect`'s clip is a no-op and the rollout stores exactly what the env was given.
    Log-probabilities are of the unit action (see SquashedGaussianPolicy); values are 0 (SAC's
    critics are the learner's alone)."""

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The mean and log-std of u for a batch (float64)."""
        raise NotImplementedError

    def with_options(self, random: bool | None = None, **options: Any) -> SACActor:
        """The same weights acting uniformly at random (heatup) or from the policy (no copy of the weights)."""
        super().with_options(**options)
        return self if random is None else self._with(random=bool(random))

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
    """An MLP SquashedGaussianPolicy's `actor.*`, `actor_logstd.*` and `obs_norm.*` tensors as numpy
    steps (several times faster than torch per step)."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]):
        if spec.discrete:
            raise ValueError("a squashed Gaussian policy needs a Box action space")
        self._bounds(spec)
        hidden = list(config.hidden_sizes)
        steps = mlp_steps(state, "actor", [spec.obs_dim, *hidden, spec.action_dim], config.activation)
        self.hidden, self.mean_head = steps[:-1], steps[-1]
        self.logstd_head = linear_step(state, "actor_logstd", hidden[-1], spec.action_dim)
        self.normalize = normalizer(state, spec, config)

    def gaussian(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = run_numpy_mlp(self.hidden, self.normalize(obs) if self.normalize is not None else obs)
        mean = h @ self.mean_head[0] + self.mean_head[1]
        log_std = log_std_from_tanh(np.tanh(h @ self.logstd_head[0] + self.logstd_head[1]))
        return mean.astype(np.float64), log_std.astype(np.float64)


def numpy_actor(spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> NumpySACActor:
    return NumpySACActor(spec, config, state)

"""Networks built from an env's spaces: an actor-critic for discrete or Box actions.

Workers act through `NumpyActor`, a numpy snapshot of the weights (see its docstring).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    # Orthogonal init (as in the PPO implementation details) keeps early policies near-uniform.
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def mlp(sizes: list[int], activation: str, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers += [layer_init(nn.Linear(sizes[i], sizes[i + 1])), _ACTIVATIONS[activation]()]
    layers.append(layer_init(nn.Linear(sizes[-2], sizes[-1]), std=out_std))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; categorical or diagonal-Gaussian action distribution."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        self.spec = spec
        hidden = list(config.hidden_sizes)
        self.critic = mlp([spec.obs_dim, *hidden, 1], config.activation, out_std=1.0)
        self.actor = mlp([spec.obs_dim, *hidden, spec.action_dim], config.activation, out_std=0.01)
        if not spec.discrete:
            self.actor_logstd = nn.Parameter(torch.full((1, spec.action_dim), config.init_log_std))

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(obs)
        if self.spec.discrete:
            return torch.distributions.Categorical(logits=out, validate_args=False)
        std = self.actor_logstd.expand_as(out).exp()
        return torch.distributions.Normal(out, std, validate_args=False)

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability and entropy of `actions`, and the state value."""
        dist = self.distribution(obs)
        if self.spec.discrete:
            logprob, entropy = dist.log_prob(actions.long()), dist.entropy()
        else:
            logprob, entropy = dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)
        return logprob, entropy, self.get_value(obs)

    def actor_snapshot(self) -> "NumpyActor":
        """A frozen numpy copy for acting: per-step torch dispatch costs more than the math here."""
        return NumpyActor(self)


def _linears(seq: nn.Sequential) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(m.weight.detach().cpu().numpy().T.astype(np.float32).copy(),
             m.bias.detach().cpu().numpy().astype(np.float32).copy())
            for m in seq if isinstance(m, nn.Linear)]


class NumpyActor:
    """Acts with a snapshot of an ActorCritic's weights, in numpy.

    Workers act one small batch per env step; for MLPs this size torch's per-op overhead dominates,
    so plain numpy is several times faster. Sampling uses a numpy Generator, so a rollout is a pure
    function of (weights, env seeds, action seed) whatever process or machine runs it.
    """

    def __init__(self, policy: ActorCritic):
        self.spec = policy.spec
        self._act = np.tanh if isinstance(policy.actor[1], nn.Tanh) else (lambda x: np.maximum(x, 0))
        self.actor = _linears(policy.actor)
        self.critic = _linears(policy.critic)
        if not self.spec.discrete:
            self.log_std = policy.actor_logstd.detach().cpu().numpy().reshape(-1).astype(np.float32)
            self.std = np.exp(self.log_std)

    def _forward(self, layers: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
        for w, b in layers[:-1]:
            x = self._act(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._forward(self.critic, obs)[:, 0]

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions (as stored: unclipped), their log-probabilities and state values, for a batch."""
        out = self._forward(self.actor, obs).astype(np.float64)
        value = self.value(obs)
        if self.spec.discrete:
            logp = out - out.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            if deterministic:
                action = logp.argmax(-1)
            else:
                # Inverse-CDF sampling from the numpy generator.
                cdf = np.exp(logp).cumsum(-1)
                u = rng.random((len(cdf), 1)) * cdf[:, -1:]
                action = np.minimum((cdf < u).sum(-1), self.spec.action_dim - 1)
            logprob = logp[np.arange(len(action)), action].astype(np.float32)
            return action.astype(np.int64), logprob, value
        mean = out.astype(np.float32)
        if deterministic:
            action = mean
        else:
            action = (mean + self.std * rng.standard_normal(mean.shape)).astype(np.float32)
        z = (action - mean) / self.std
        logprob = (-0.5 * z * z - self.log_std - 0.5 * np.log(2 * np.pi)).sum(-1).astype(np.float32)
        return action, logprob, value


def build_policy(spec: SpaceSpec, config: PolicyConfig) -> ActorCritic:
    return ActorCritic(spec, config)


class QNetwork(nn.Module):
    """Action values for discrete actions: an MLP from observation to one Q per action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if not spec.discrete:
            raise ValueError("DQN needs a discrete action space")
        self.spec = spec
        self.q = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation,
                     out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs)

    def actor_snapshot(self) -> "NumpyQActor":
        return NumpyQActor(self)


class NumpyQActor:
    """Greedy (or epsilon-greedy) acting with a numpy snapshot of a QNetwork; see NumpyActor."""

    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self._act = np.tanh if isinstance(net.q[1], nn.Tanh) else (lambda x: np.maximum(x, 0))
        self.layers = _linears(net.q)
        self.epsilon = epsilon

    def with_epsilon(self, epsilon: float) -> "NumpyQActor":
        """The same weights acting with another exploration rate (no copy of the weights)."""
        other = object.__new__(NumpyQActor)
        other.__dict__.update(self.__dict__, epsilon=epsilon)
        return other

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        x = obs
        for w, b in self.layers[:-1]:
            x = self._act(x @ w + b)
        w, b = self.layers[-1]
        return x @ w + b

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).max(-1).astype(np.float32)

    def act(self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = self.q_values(obs)
        action = q.argmax(-1)
        if not deterministic and self.epsilon > 0:
            explore = rng.random(len(action)) < self.epsilon
            action = np.where(explore, rng.integers(0, self.spec.action_dim, len(action)), action)
        return action.astype(np.int64), np.zeros(len(action), np.float32), q.max(-1).astype(np.float32)


def build_network(algo: str, spec: SpaceSpec, config: PolicyConfig) -> nn.Module:
    """The network an algorithm trains and workers act with."""
    return QNetwork(spec, config) if algo == "dqn" else ActorCritic(spec, config)


class PolicyMismatch(ValueError):
    """Saved tensors that do not fit the network an env's spaces call for (another env's policy)."""


def _linear_shapes(state: dict[str, torch.Tensor], head: str) -> list[tuple[int, ...]]:
    """Shapes of the Linear weights of the `head` MLP (`actor`, `q`) in a state dict, in order."""
    found = []
    for key, tensor in state.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == head and parts[1].isdigit() and parts[2] == "weight":
            found.append((int(parts[1]), tuple(tensor.shape)))
    return [shape for _, shape in sorted(found)]


def _actions(discrete: bool, n: int) -> str:
    return f"{n} discrete action{'s' if n != 1 else ''}" if discrete else f"{n}-dimensional continuous actions"


def load_network(algo: str, spec: SpaceSpec, config: PolicyConfig,
                 state: dict[str, torch.Tensor]) -> nn.Module:
    """The network `algo` acts with (see build_network), built for an env's `spec` and loaded with a
    saved `state`. Raises PolicyMismatch saying what does not fit (observation size, kind or number
    of actions) when the policy was trained on other spaces, or when its tensors are not the network
    its metadata describes."""
    if algo not in ("ppo", "dqn"):
        raise PolicyMismatch(f"unknown algorithm {algo!r} in its metadata (ppo or dqn)")
    head = "q" if algo == "dqn" else "actor"
    layers = _linear_shapes(state, head)
    problems = []
    if layers and all(len(shape) == 2 for shape in layers):
        obs_dim, out = layers[0][1], layers[-1][0]
        discrete = algo == "dqn" or "actor_logstd" not in state
        if obs_dim != spec.obs_dim:
            problems.append(f"it takes observations of size {obs_dim}, the env's have size {spec.obs_dim}")
        if discrete != spec.discrete or out != spec.action_dim:
            problems.append(f"it acts with {_actions(discrete, out)}, the env takes "
                            f"{_actions(spec.discrete, spec.action_dim)}")
    if problems:
        raise PolicyMismatch("; ".join(problems))
    try:
        network = build_network(algo, spec, config)
        network.load_state_dict(state)
    except (RuntimeError, ValueError) as exc:  # tensors of another network (e.g. other hidden sizes)
        detail = " ".join(str(exc).split())
        detail = detail if len(detail) <= 400 else detail[:400] + " ..."
        raise PolicyMismatch(f"its tensors are not the {algo} network its metadata describes: {detail}") from None
    return network

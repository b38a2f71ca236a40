"""DQN's Q-network and the actors workers act with it, greedy or epsilon-greedy (PURE: torch, numpy)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.envs.opponents import random_legal
from rlfarm.nn.actors import Actor, numpy_mlp, run_numpy_mlp
from rlfarm.nn.layers import NatureCNN, layer_init, mlp


class QNetwork(nn.Module):
    """Action values for discrete actions: an MLP, or a CNN encoder and a linear head, to one Q per action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if not spec.discrete:
            raise ValueError("a Q-network needs a discrete action space")
        self.spec = spec
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.q = nn.Sequential(layer_init(nn.Linear(self.encoder.features, spec.action_dim), std=1.0))
        else:
            self.encoder = None
            self.q = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.encoder(obs) if self.encoder is not None else obs)

    def actor_snapshot(self) -> QActor:
        return TorchQActor(self) if self.encoder is not None else NumpyQActor(self)


class QActor(Actor):
    """Greedy or epsilon-greedy acting from Q-values; subclasses compute them."""

    epsilon: float = 0.0

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def with_options(self, epsilon: float | None = None, **options: Any) -> QActor:
        """The same weights acting with another exploration rate (no copy of the weights)."""
        super().with_options(**options)
        return self if epsilon is None else self._with(epsilon=float(epsilon))

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self.q_values(obs).max(-1).astype(np.float32)

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q = self.q_values(obs)
        if mask is not None:  # the best legal action; exploration among the legal ones
            q = np.where(mask, q, -np.inf)
        action = q.argmax(-1)
        if not deterministic and self.epsilon > 0:
            explore = rng.random(len(action)) < self.epsilon
            if mask is None:
                random = rng.integers(0, self.spec.action_dim, len(action))
            else:
                random = random_legal(obs, mask, rng)
            action = np.where(explore, random, action)
        return action.astype(np.int64), np.zeros(len(action), np.float32), q.max(-1).astype(np.float32)


class NumpyQActor(QActor):
    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self.layers = numpy_mlp(net.q)
        self.epsilon = epsilon

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return run_numpy_mlp(self.layers, obs)


class TorchQActor(QActor):
    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self.net = copy.deepcopy(net).cpu().eval()
        self.epsilon = epsilon

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy()

"""DQN's Q-network and the actors workers act with it, greedy or epsilon-greedy (PURE: torch, numpy)."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from rlfarm.algos.dqn.acting import NumpyQActor, QActor
from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.actors import numpy_state
from rlfarm.nn.layers import NatureCNN, layer_init, mlp


class QNetwork(nn.Module):
    """Action values for discrete actions: an MLP, or a CNN encoder and a linear head, to one Q per action."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig):
        super().__init__()
        if not spec.discrete:
            raise ValueError("a Q-network needs a discrete action space")
        self.spec, self.config = spec, config
        if spec.is_image:
            self.encoder = NatureCNN(spec, config)
            self.q = nn.Sequential(layer_init(nn.Linear(self.encoder.features, spec.action_dim), std=1.0))
        else:
            self.encoder = None
            self.q = mlp([spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation, out_std=1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(self.encoder(obs) if self.encoder is not None else obs)

    def actor_snapshot(self) -> QActor:
        return TorchQActor(self) if self.encoder is not None else NumpyQActor(self.spec, self.config, numpy_state(self))


class TorchQActor(QActor):
    def __init__(self, net: QNetwork, epsilon: float = 0.0):
        self.spec = net.spec
        self.net = copy.deepcopy(net).cpu().eval()
        self.epsilon = epsilon

    @torch.no_grad()
    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self.net(torch.from_numpy(np.ascontiguousarray(obs))).numpy()

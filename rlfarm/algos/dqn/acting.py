"""DQN's actors without torch (PURE: numpy): greedy or epsilon-greedy acting from Q-values, and the
numpy actor of an MLP `QNetwork` (rlfarm.algos.dqn.policies), built from its saved tensors alone, so a
worker acting it never imports torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.envs.opponents import random_legal
from rlfarm.nn.acting import Actor, mlp_steps, run_numpy_mlp

HEAD = "q"  # the output MLP of a saved policy: its sizes are read from it (rlfarm.algos.saved)


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
    """An MLP Q-network's `q.*` tensors as numpy steps."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray], epsilon: float = 0.0):
        if not spec.discrete:
            raise ValueError("a Q-network needs a discrete action space")
        self.spec = spec
        self.layers = mlp_steps(state, "q", [spec.obs_dim, *config.hidden_sizes, spec.action_dim], config.activation)
        self.epsilon = epsilon

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return run_numpy_mlp(self.layers, obs)


def numpy_actor(spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> NumpyQActor:
    return NumpyQActor(spec, config, state)

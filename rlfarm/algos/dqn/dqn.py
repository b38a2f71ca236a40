"""Double DQN (van Hasselt et al. 2016) with a target network, Huber loss, n-step returns and optional
prioritized replay. Exploration (epsilon-greedy) happens on the workers, with the epsilon this
learner asks for in each task's acting options.

ASYNC only. Replay, heatup (`learning_starts` random steps), the replay ratio (gradient steps per
consumed env step) and PER's beta schedule are rlfarm.algos.offpolicy's, shared with SAC; this module
is the Q-network, the epsilon schedule and the gradient step.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from rlfarm.algos.base import load_optimizer_state, optimizer_state, prefixed, to_device, unprefixed
from rlfarm.algos.dqn.acting import HEAD
from rlfarm.algos.dqn.policies import QNetwork
from rlfarm.algos.offpolicy import OffPolicy
from rlfarm.config import PolicyConfig, RunConfig
from rlfarm.core.replay import Batch
from rlfarm.envs import SpaceSpec
from rlfarm.nn.adam import Adam
from rlfarm.nn.layers import place


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """Linear from `start` to `end` over the first `fraction` of training, then `end`."""
    if fraction <= 0:
        return end
    return start + (end - start) * min(1.0, progress / fraction)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients to a global L2 norm of at most `max_norm`; returns the norm before clipping.
    Same result as nn.utils.clip_grad_norm_, without its per-call checks."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


class DQN(OffPolicy):
    name = "dqn"
    head = HEAD  # the output MLP of a saved policy (its acting module's)
    loss_keys = ("losses/td_loss", "losses/q_values", "losses/grad_norm", "charts/learning_rate")

    @classmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> QNetwork:
        return QNetwork(spec, config)

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        self.q_network = place(self.build_network(spec, config.policy), device)
        self.target_network = copy.deepcopy(self.q_network)
        # fused Adam and a foreach gradient clip: a 64x64 MLP step is dominated by per-op dispatch,
        # so fewer kernels make the learner faster (benchmarks/learner.py).
        self.optimizer = Adam(self.q_network.parameters(), lr=self.config.learning_rate)
        self._params = list(self.q_network.parameters())

    @property
    def policy(self) -> QNetwork:
        return self.q_network

    def epsilon(self, progress: float) -> float:
        if self.heatup:
            return 1.0  # uniform random actions
        c = self.config
        return linear_schedule(c.exploration_initial_eps, c.exploration_final_eps, c.exploration_fraction, progress)

    def random_acting(self) -> dict[str, Any]:
        return {"epsilon": 1.0}

    def policy_acting(self, progress: float) -> dict[str, Any]:
        return {"epsilon": self.epsilon(progress)}

    def scalars(self, progress: float) -> dict[str, float]:
        return {"charts/epsilon": self.epsilon(progress), **super().scalars(progress)}

    def train_step(self, batch: Batch, progress: float = 0.0) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step; returns metrics and the absolute TD errors (for priorities).

        `progress` (0..1 of total_steps) drives learning-rate annealing when enabled."""
        if self.config.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.learning_rate * max(0.0, 1.0 - progress)
        dev = self.device
        obs = to_device(batch.obs, dev)
        next_obs = to_device(batch.next_obs, dev)
        actions = to_device(batch.actions, dev).long()
        rewards = to_device(batch.rewards, dev)
        not_done = 1.0 - to_device(batch.dones, dev).float()
        discounts = to_device(batch.discounts, dev)
        weights = to_device(batch.weights, dev)

        with torch.no_grad():
            # Double DQN: the online network picks the next action, the target network values it.
            next_q_online = self.q_network(next_obs)
            if batch.next_action_masks is not None:  # the max is over the legal next actions only
                legal = to_device(batch.next_action_masks, dev)
                # A next state with no legal action (a finished game) is done: no bootstrap, any pick will do.
                legal = legal | ~legal.any(-1, keepdim=True)
                next_q_online = next_q_online.masked_fill(~legal, -torch.inf)
            next_actions = next_q_online.argmax(-1, keepdim=True)
            next_q = self.target_network(next_obs).gather(-1, next_actions).squeeze(-1)
            target = rewards + discounts * not_done * next_q
        q = self.q_network(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        td = target - q
        loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = clip_grad_norm(self._params, self.config.max_grad_norm)
        self.optimizer.step()
        self._update_target()
        metrics = {
            "losses/td_loss": loss.item(),
            "losses/q_values": q.mean().item(),
            "losses/grad_norm": float(grad_norm),
            "charts/learning_rate": self.optimizer.param_groups[0]["lr"],
        }
        return metrics, td.detach().abs().cpu().numpy()

    def _update_target(self) -> None:
        c = self.config
        if c.tau >= 1.0:
            if self.gradient_steps % c.target_update_interval == 0:
                self.target_network.load_state_dict(self.q_network.state_dict())
            return
        with torch.no_grad():  # Polyak averaging every step
            for p, tp in zip(self.q_network.parameters(), self.target_network.parameters()):
                tp.mul_(1 - c.tau).add_(p, alpha=c.tau)

    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.q_network.state_dict().items()}

    def learner_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        optim_tensors, optim_meta = optimizer_state(self.optimizer)
        tensors = {
            **prefixed("policy", self.q_network.state_dict()),
            **prefixed("target", self.target_network.state_dict()),
            **optim_tensors,
        }
        return tensors, {"optimizer": optim_meta}

    def restore_learner(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        self.q_network.load_state_dict(unprefixed("policy", tensors))
        self.target_network.load_state_dict(unprefixed("target", tensors))
        load_optimizer_state(self.optimizer, tensors, state["optimizer"])

"""Double DQN (van Hasselt et al. 2016) with a target network, Huber loss and optional prioritized
replay. Exploration (epsilon-greedy) happens on the workers; this module only learns."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlfarm.config import DQNConfig
from rlfarm.policy import QNetwork
from rlfarm.replay import Batch


def linear_schedule(start: float, end: float, fraction: float, progress: float) -> float:
    """Linear from `start` to `end` over the first `fraction` of training, then `end`."""
    if fraction <= 0:
        return end
    return start + (end - start) * min(1.0, progress / fraction)


class DQN:
    name = "dqn"

    def __init__(self, q_network: QNetwork, config: DQNConfig, seed: int, device: torch.device):
        self.config = config
        self.device = device
        self.q_network = q_network.to(device)
        self.target_network = copy.deepcopy(self.q_network)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=config.learning_rate)
        self.gradient_steps = 0

    @property
    def policy(self) -> QNetwork:
        return self.q_network

    def epsilon(self, progress: float) -> float:
        c = self.config
        return linear_schedule(c.exploration_initial_eps, c.exploration_final_eps, c.exploration_fraction,
                               progress)

    def train_step(self, batch: Batch, progress: float = 0.0) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step; returns metrics and the absolute TD errors (for priorities).

        `progress` (0..1 of total_steps) drives learning-rate annealing when enabled."""
        if self.config.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = self.config.learning_rate * max(0.0, 1.0 - progress)
        dev = self.device
        obs = torch.as_tensor(batch.obs, device=dev)
        next_obs = torch.as_tensor(batch.next_obs, device=dev)
        actions = torch.as_tensor(batch.actions, device=dev).long()
        rewards = torch.as_tensor(batch.rewards, device=dev)
        not_done = 1.0 - torch.as_tensor(batch.dones, device=dev, dtype=torch.float32)
        discounts = torch.as_tensor(batch.discounts, device=dev)
        weights = torch.as_tensor(batch.weights, device=dev)

        with torch.no_grad():
            # Double DQN: the online network picks the next action, the target network values it.
            next_actions = self.q_network(next_obs).argmax(-1, keepdim=True)
            next_q = self.target_network(next_obs).gather(-1, next_actions).squeeze(-1)
            target = rewards + discounts * not_done * next_q
        q = self.q_network(obs).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        td = target - q
        loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.q_network.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.gradient_steps += 1
        self._update_target()
        metrics = {"losses/td_loss": loss.item(), "losses/q_values": q.mean().item(),
                   "losses/grad_norm": float(grad_norm),
                   "charts/learning_rate": self.optimizer.param_groups[0]["lr"]}
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

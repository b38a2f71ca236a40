"""Soft Actor-Critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") with
automatic entropy tuning, CleanRL-style: twin soft Q-networks with Polyak-averaged targets, a
tanh-squashed Gaussian policy scaled to the env's bounds, and an entropy coefficient alpha tuned by
its own Adam towards a target entropy of -action_dim.

ASYNC only. Replay, heatup, the replay ratio and PER are rlfarm.algos.offpolicy's, shared with DQN;
this module is the networks and the gradient step. Workers act with a numpy snapshot of the policy
(rlfarm.algos.sac.policies.SACActor): during heatup uniformly in the bounds (acting option `random`), then by
sampling the policy; greedy evaluation takes the mean action. Replay holds the actions as the env
took them; the critics see them mapped to [-1, 1], the scale the policy's tanh produces.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlfarm.algos.base import networks_state, restore_networks
from rlfarm.algos.offpolicy import OffPolicy, critic_batch, twin_critic_step
from rlfarm.algos.sac.acting import HEAD
from rlfarm.algos.sac.policies import SquashedGaussianPolicy
from rlfarm.config import PolicyConfig, RunConfig
from rlfarm.core.replay import Batch
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.nn.adam import Adam
from rlfarm.nn.critics import ActionValueNetwork
from rlfarm.nn.layers import place

# The networks in a checkpoint: tensor prefix -> attribute (the policy's prefix is "actor", as written
# before the attribute was named policy).
_NETWORKS = {"actor": "policy", "qf1": "qf1", "qf2": "qf2", "qf1_target": "qf1_target", "qf2_target": "qf2_target"}
_ACTOR_KEYS = ("losses/actor_loss", "losses/alpha_loss", "losses/entropy")


@contextmanager
def frozen(params: list[torch.Tensor]) -> Iterator[None]:
    """No gradients for `params` inside: the actor's loss runs through the critics, whose weight
    gradients it would compute for nothing (and leave behind)."""
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class SAC(OffPolicy):
    name = "sac"
    head = HEAD  # the output MLP of a saved policy (its acting module's)
    loss_keys = (
        "losses/qf1_values",
        "losses/qf2_values",
        "losses/qf1_loss",
        "losses/qf2_loss",
        "losses/qf_loss",
        *_ACTOR_KEYS,
        "losses/alpha",
    )

    @classmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> SquashedGaussianPolicy:
        return SquashedGaussianPolicy(spec, config)

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        cfg = self.config
        self.policy = place(self.build_network(spec, config.policy), device)
        self.qf1 = place(ActionValueNetwork(spec, config.policy), device)
        self.qf2 = place(ActionValueNetwork(spec, config.policy), device)
        self.qf1_target = copy.deepcopy(self.qf1).requires_grad_(False)
        self.qf2_target = copy.deepcopy(self.qf2).requires_grad_(False)
        self._q_params = [*self.qf1.parameters(), *self.qf2.parameters()]
        self._target_params = [*self.qf1_target.parameters(), *self.qf2_target.parameters()]
        # fused Adam: one kernel for all parameters (per-op dispatch dominates at these sizes, as in DQN).
        self.q_optimizer = Adam(self._q_params, lr=cfg.learning_rate)
        self.actor_optimizer = Adam(self.policy.parameters(), lr=cfg.learning_rate)
        self.target_entropy = -float(spec.action_dim)
        # alpha is learned as log(alpha): it stays positive, and steps are relative to its size.
        self.log_alpha = torch.full((1,), math.log(cfg.initial_alpha), device=device, requires_grad=True)
        self.a_optimizer = Adam([self.log_alpha], lr=cfg.learning_rate)
        # The policy's noise in the learner comes from a private generator, saved in checkpoints, so a
        # resumed run draws the same noise as an uninterrupted one.
        self.generator = torch.Generator(device=device).manual_seed(config.seed)
        self._actor_metrics: dict[str, float] = dict.fromkeys(_ACTOR_KEYS, math.nan)

    @property
    def alpha(self) -> torch.Tensor:
        """The entropy coefficient now (not differentiable)."""
        if self.config.autotune:
            return self.log_alpha.detach().exp()
        return torch.full((1,), self.config.alpha, device=self.device)

    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        """Into replay (raw observations), and the observations into the running statistics."""
        super().observe(rollout, policy_lag)
        if self.policy.obs_norm is not None:
            self.policy.obs_norm.update(rollout.obs.reshape(-1, self.spec.obs_dim))

    def random_acting(self) -> dict[str, Any]:
        return {"random": True}  # uniform in the bounds (rlfarm.algos.sac.policies.SACActor)

    def policy_acting(self, progress: float) -> dict[str, Any]:
        return {}  # sampling the policy is SAC's exploration

    def train_step(self, batch: Batch, progress: float = 0.0) -> tuple[dict[str, float], np.ndarray]:
        """A critic step on the batch; every `policy_frequency` gradient steps, that many actor (and
        alpha) steps; every `target_network_frequency`, a Polyak update of the target critics."""
        cfg = self.config
        b = critic_batch(batch, self.policy, self.device)
        with torch.no_grad():
            # The soft target: the smaller target critic of a fresh action from the current policy,
            # minus its log-probability times alpha.
            next_actions, next_logprob = self.policy.sample(b.next_obs, self.generator)
            next_q = torch.min(self.qf1_target(b.q_next_obs, next_actions), self.qf2_target(b.q_next_obs, next_actions))
            target = b.rewards + b.discounts * b.not_done * (next_q - self.alpha * next_logprob)
        metrics, td_errors = twin_critic_step(self.qf1, self.qf2, self.q_optimizer, b, target)

        if self.gradient_steps % cfg.policy_frequency == 0:
            for _ in range(cfg.policy_frequency):
                self._actor_metrics = self._policy_step(b.obs, b.q_obs)
        if self.gradient_steps % cfg.target_network_frequency == 0:
            with torch.no_grad():  # target <- (1 - tau) target + tau online
                torch._foreach_lerp_(self._target_params, self._q_params, cfg.tau)
        return {**metrics, **self._actor_metrics, "losses/alpha": self.alpha.item()}, td_errors

    def _policy_step(self, obs: torch.Tensor, q_obs: torch.Tensor) -> dict[str, float]:
        """One actor step, maximising min(Q1, Q2) - alpha log pi, then (autotune) one alpha step.
        `q_obs`: the observations as the critics see them (normalised)."""
        alpha = self.alpha
        pi, log_pi = self.policy.sample(obs, self.generator)
        with frozen(self._q_params):
            q_pi = torch.min(self.qf1(q_obs, pi), self.qf2(q_obs, pi))
        actor_loss = (alpha * log_pi - q_pi).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        alpha_loss = torch.zeros(())
        if self.config.autotune:
            # J(alpha) = E[-alpha (log pi + target entropy)]: alpha grows while the policy's entropy is
            # below the target and shrinks above it.
            alpha_loss = (-self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)).mean()
            self.a_optimizer.zero_grad()
            alpha_loss.backward()
            self.a_optimizer.step()
        return {
            "losses/actor_loss": actor_loss.item(),
            "losses/alpha_loss": alpha_loss.item(),
            "losses/entropy": -log_pi.detach().mean().item(),
        }

    def state(self) -> dict[str, torch.Tensor]:
        """The policy alone: workers never run the critics."""
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def _optimizers(self) -> dict[str, Adam]:
        return {"q_optim": self.q_optimizer, "actor_optim": self.actor_optimizer, "alpha_optim": self.a_optimizer}

    def _networks(self) -> dict[str, torch.nn.Module]:
        return {prefix: getattr(self, attribute) for prefix, attribute in _NETWORKS.items()}

    def learner_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = networks_state(self._networks(), self._optimizers())
        own = {"log_alpha": self.log_alpha.detach().clone(), "rng.sac": self.generator.get_state()}
        return {**own, **tensors}, {"actor_metrics": self._actor_metrics, **meta}

    def restore_learner(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        restore_networks(self._networks(), self._optimizers(), tensors, state)
        with torch.no_grad():
            self.log_alpha.copy_(tensors["log_alpha"])
        self.generator.set_state(tensors["rng.sac"])
        self._actor_metrics = dict(state["actor_metrics"])

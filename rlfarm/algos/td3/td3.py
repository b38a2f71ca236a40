"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"): a
deterministic actor and twin critics, with the paper's three changes to DDPG:

- clipped double Q-learning: the critics' target is the smaller of the two target critics;
- target policy smoothing: the target actor's action plus N(0, target_policy_noise) clipped to
  +-target_noise_clip, then to [-1, 1];
- delayed policy updates: every `policy_delay` critic steps the actor takes one step maximising Q1,
  and then (only then) the target actor and critics move towards the online ones by Polyak (tau).

ASYNC only. Replay, heatup, the replay ratio and PER are rlfarm.algos.offpolicy's, shared with DQN and
SAC; this module is the networks and the gradient step. Workers act with a numpy snapshot of the
actor (rlfarm.algos.td3.policies.TD3Actor): during heatup uniformly in the bounds (acting option
`random`), then the deterministic action plus Gaussian noise (acting option `noise`); greedy
evaluation takes the deterministic action. Replay holds actions as the env took them; the critics see
them mapped to [-1, 1], the scale of the actor's tanh and of every noise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlfarm.algos.base import networks_state, restore_networks
from rlfarm.algos.offpolicy import OffPolicy, critic_batch, twin_critic_step
from rlfarm.algos.td3.acting import HEAD
from rlfarm.algos.td3.policies import DeterministicPolicy
from rlfarm.config import PolicyConfig, RunConfig
from rlfarm.core.replay import Batch
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.nn.adam import Adam
from rlfarm.nn.critics import ActionValueNetwork
from rlfarm.nn.layers import place

# The networks in a checkpoint: tensor prefix -> attribute.
_NETWORKS = {
    "actor": "policy",
    "actor_target": "policy_target",
    "qf1": "qf1",
    "qf2": "qf2",
    "qf1_target": "qf1_target",
    "qf2_target": "qf2_target",
}
_ACTOR_KEYS = ("losses/actor_loss",)


class TD3(OffPolicy):
    name = "td3"
    head = HEAD  # the output MLP of a saved policy (its acting module's)
    loss_keys = (
        "losses/qf1_values",
        "losses/qf2_values",
        "losses/qf1_loss",
        "losses/qf2_loss",
        "losses/qf_loss",
        *_ACTOR_KEYS,
    )

    @classmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> DeterministicPolicy:
        return DeterministicPolicy(spec, config)

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        cfg = self.config
        self.policy = place(self.build_network(spec, config.policy), device)
        self.policy_target = copy.deepcopy(self.policy).requires_grad_(False)
        if self.policy.obs_norm is not None:
            # One set of observation statistics: the target actor normalises with the current ones,
            # as the critics do (they are buffers, which Polyak averaging would leave behind).
            self.policy_target.obs_norm = self.policy.obs_norm
        self.qf1 = place(ActionValueNetwork(spec, config.policy), device)
        self.qf2 = place(ActionValueNetwork(spec, config.policy), device)
        self.qf1_target = copy.deepcopy(self.qf1).requires_grad_(False)
        self.qf2_target = copy.deepcopy(self.qf2).requires_grad_(False)
        self._q_params = [*self.qf1.parameters(), *self.qf2.parameters()]
        self._actor_params = list(self.policy.parameters())
        self._online = [*self._q_params, *self._actor_params]
        self._targets = [*self.qf1_target.parameters(), *self.qf2_target.parameters(), *self.policy_target.parameters()]
        # fused Adam: one kernel for all parameters (per-op dispatch dominates at these sizes).
        self.q_optimizer = Adam(self._q_params, lr=cfg.learning_rate)
        self.actor_optimizer = Adam(self._actor_params, lr=cfg.learning_rate)
        # Target smoothing noise comes from a private generator, saved in checkpoints, so a resumed run
        # draws the same noise as an uninterrupted one.
        self.generator = torch.Generator(device=device).manual_seed(config.seed)
        self._actor_metrics: dict[str, float] = dict.fromkeys(_ACTOR_KEYS, math.nan)

    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        """Into replay (raw observations), and the observations into the running statistics."""
        super().observe(rollout, policy_lag)
        if self.policy.obs_norm is not None:
            self.policy.obs_norm.update(rollout.obs.reshape(-1, self.spec.obs_dim))

    def random_acting(self) -> dict[str, Any]:
        return {"random": True}  # uniform in the bounds (rlfarm.algos.td3.policies.TD3Actor)

    def policy_acting(self, progress: float) -> dict[str, Any]:
        return {"noise": self.config.exploration_noise}  # Gaussian, in unit scale

    def smoothed_target_actions(self, next_obs: torch.Tensor) -> torch.Tensor:
        """Target policy smoothing: mu'(s') + clip(N(0, sigma), -c, c), clipped to [-1, 1] (unit scale)."""
        cfg = self.config
        target = self.policy_target(next_obs)
        noise = torch.randn(target.shape, generator=self.generator, device=target.device, dtype=target.dtype)
        noise = (noise * cfg.target_policy_noise).clamp(-cfg.target_noise_clip, cfg.target_noise_clip)
        return (target + noise).clamp(-1.0, 1.0)

    def train_step(self, batch: Batch, progress: float = 0.0) -> tuple[dict[str, float], np.ndarray]:
        """A critic step on the batch; every `policy_delay` gradient steps an actor step and a Polyak
        update of the target actor and critics."""
        cfg = self.config
        b = critic_batch(batch, self.policy, self.device)
        with torch.no_grad():
            next_actions = self.smoothed_target_actions(b.next_obs)
            next_q = torch.min(self.qf1_target(b.q_next_obs, next_actions), self.qf2_target(b.q_next_obs, next_actions))
            target = b.rewards + b.discounts * b.not_done * next_q
        metrics, td_errors = twin_critic_step(self.qf1, self.qf2, self.q_optimizer, b, target)

        if self.gradient_steps % cfg.policy_delay == 0:
            self._actor_metrics = self._policy_step(b.obs, b.q_obs)
            with torch.no_grad():  # target <- (1 - tau) target + tau online, actor and critics
                torch._foreach_lerp_(self._targets, self._online, cfg.tau)
        return {**metrics, **self._actor_metrics}, td_errors

    def _policy_step(self, obs: torch.Tensor, q_obs: torch.Tensor) -> dict[str, float]:
        """One actor step maximising Q1(s, mu(s)) (the paper's deterministic policy gradient through
        the first critic). `q_obs`: the observations as the critics see them (normalised)."""
        actor_loss = -self.qf1(q_obs, self.policy(obs)).mean()
        self.actor_optimizer.zero_grad()
        # Gradients of the actor's parameters only: the critic's would be computed for nothing.
        actor_loss.backward(inputs=self._actor_params)
        self.actor_optimizer.step()
        return {"losses/actor_loss": actor_loss.item()}

    def state(self) -> dict[str, torch.Tensor]:
        """The actor alone: workers never run the critics or the targets."""
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def _optimizers(self) -> dict[str, Adam]:
        return {"q_optim": self.q_optimizer, "actor_optim": self.actor_optimizer}

    def _networks(self) -> dict[str, torch.nn.Module]:
        return {prefix: getattr(self, attribute) for prefix, attribute in _NETWORKS.items()}

    def learner_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors, meta = networks_state(self._networks(), self._optimizers())
        own = {"rng.td3": self.generator.get_state()}
        return {**own, **tensors}, {"actor_metrics": self._actor_metrics, **meta}

    def restore_learner(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        restore_networks(self._networks(), self._optimizers(), tensors, state)
        self.generator.set_state(tensors["rng.td3"])
        self._actor_metrics = dict(state["actor_metrics"])

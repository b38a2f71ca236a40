"""What every off-policy learner on the farm shares (PURE): DQN, SAC and TD3 are this plus their networks
and their gradient step (SAC's and TD3's critics step through `critic_batch` and `twin_critic_step`).

- the replay buffer (uniform or prioritized, `<algo>.prioritized`), fed with n-step transitions of
  each result as it is observed;
- heatup: until `learning_starts` transitions were observed, tasks act at random (the subclass says
  how: DQN with epsilon 1, SAC uniformly in the action bounds) and nothing is learned;
- the replay ratio: gradient steps owed per consumed env step, paid one `update` at a time, so the
  ASYNC trainer publishes, receives results and sends tasks between gradient steps;
- PER's importance-sampling exponent beta, annealed from `per_beta` to 1 over the run;
- checkpointing of the buffer (with `checkpoint_replay`), its sampler's RNG and the counters.

The algorithm's config section (`RunConfig.<name>`) must have the replay fields: gamma, n_step,
batch_size, buffer_size, learning_starts, replay_ratio, prioritized, per_alpha, per_beta, per_eps.
ASYNC only: a replay learner never needs a whole group acted with one version.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from rlfarm.algos.base import Algorithm, prefixed, to_device, unprefixed
from rlfarm.config import RunConfig
from rlfarm.core.replay import Batch, PrioritizedReplayBuffer, ReplayBuffer, nstep_transitions
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.nn.adam import Adam


class CriticBatch(NamedTuple):
    """A replayed batch on the learner's device as an actor-critic of continuous actions takes it."""

    obs: torch.Tensor  # raw, as replayed: the actor normalises its own input
    next_obs: torch.Tensor
    q_obs: torch.Tensor  # normalised with the actor's (current) statistics, as the critics see them
    q_next_obs: torch.Tensor
    actions: torch.Tensor  # in unit scale, [-1, 1]
    rewards: torch.Tensor
    not_done: torch.Tensor
    discounts: torch.Tensor
    weights: torch.Tensor  # PER's importance weights (ones without PER)


def critic_batch(batch: Batch, policy: Any, device: torch.device) -> CriticBatch:
    """`batch` for SAC's and TD3's gradient step; `policy` an rlfarm.nn.layers.BoundedPolicy."""
    obs = to_device(batch.obs, device)
    next_obs = to_device(batch.next_obs, device)
    return CriticBatch(
        obs,
        next_obs,
        policy.normalize(obs),
        policy.normalize(next_obs),
        policy.to_unit(to_device(batch.actions, device)),
        to_device(batch.rewards, device),
        1.0 - to_device(batch.dones, device).float(),
        to_device(batch.discounts, device),
        to_device(batch.weights, device),
    )


def twin_critic_step(
    qf1: torch.nn.Module, qf2: torch.nn.Module, optimizer: Adam, b: CriticBatch, target: torch.Tensor
) -> tuple[dict[str, float], np.ndarray]:
    """One step of both critics towards `target` (PER-weighted squared error), as SAC and TD3 take it
    (Fujimoto et al. 2018's clipped double Q: `target` already holds the smaller target critic).
    Returns the critics' metrics and each sample's TD error for PER (the mean of both critics')."""
    qf1_values = qf1(b.q_obs, b.actions)
    qf2_values = qf2(b.q_obs, b.actions)
    td1, td2 = qf1_values - target, qf2_values - target
    qf1_loss = (b.weights * td1.pow(2)).mean()
    qf2_loss = (b.weights * td2.pow(2)).mean()
    qf_loss = qf1_loss + qf2_loss
    optimizer.zero_grad()
    qf_loss.backward()
    optimizer.step()
    metrics = {
        "losses/qf1_values": qf1_values.mean().item(),
        "losses/qf2_values": qf2_values.mean().item(),
        "losses/qf1_loss": qf1_loss.item(),
        "losses/qf2_loss": qf2_loss.item(),
        "losses/qf_loss": qf_loss.item() / 2.0,
    }  # the mean of the two, as CleanRL logs it
    return metrics, (0.5 * (td1.detach().abs() + td2.detach().abs())).cpu().numpy()


class OffPolicy(Algorithm):
    """Replay, heatup, replay ratio and PER for a learner that supplies `train_step` and its networks."""

    collect_next_obs = True  # replay needs each step's real next observation

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        cfg = self.config
        buffer = PrioritizedReplayBuffer if cfg.prioritized else ReplayBuffer
        extra = {"alpha": cfg.per_alpha, "eps": cfg.per_eps} if cfg.prioritized else {}
        # Actions are stored as the env took them: int64 indices, or float32 vectors of the Box's shape.
        self.replay = buffer(
            cfg.buffer_size,
            spec.obs_shape,
            action_shape=spec.action_shape,
            action_dtype=spec.action_dtype,
            obs_dtype=spec.obs_dtype,
            seed=config.seed,
            **extra,
        )
        self.gradient_steps = 0
        self.env_steps = 0  # transitions observed (heatup counts these)
        self.grad_budget = 0.0  # gradient steps owed by the replay ratio

    # ---- what a subclass supplies ------------------------------------------------------------------
    @abstractmethod
    def random_acting(self) -> dict[str, Any]:
        """Acting options that make a task act uniformly at random (heatup)."""

    @abstractmethod
    def policy_acting(self, progress: float) -> dict[str, Any]:
        """Acting options after heatup (DQN: its epsilon schedule)."""

    @abstractmethod
    def train_step(self, batch: Batch, progress: float) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step on a replayed batch (`self.gradient_steps` already counts it); its
        metrics and the absolute TD errors of the batch (PER's new priorities)."""

    @abstractmethod
    def learner_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The subclass's part of a checkpoint: networks, optimizers, private RNGs."""

    @abstractmethod
    def restore_learner(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        """The inverse of `learner_state`."""

    # ---- the shared learner ------------------------------------------------------------------------
    @property
    def heatup(self) -> bool:
        return self.env_steps < self.config.learning_starts

    def acting(self, progress: float) -> dict[str, Any]:
        return self.random_acting() if self.heatup else self.policy_acting(progress)

    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        cfg = self.config
        self.env_steps += rollout.num_steps
        self.replay.add(nstep_transitions(rollout, cfg.n_step, cfg.gamma))
        if self.env_steps >= cfg.learning_starts:
            self.grad_budget += rollout.num_steps * cfg.replay_ratio

    def ready(self) -> bool:
        return self.grad_budget >= 1.0

    def versions_per_result(self) -> float:
        run = self.run_config
        steps = run.env.num_envs * run.farm.steps_per_env
        return steps * self.config.replay_ratio / self.publish_every

    def update(self, progress: float, between: Callable[[], None] | None = None) -> dict[str, float]:
        """One gradient step on a replayed batch. One step per update keeps each update short: the
        ASYNC trainer pumps results and publishes between them (a version every publish_interval)."""
        cfg = self.config
        beta = cfg.per_beta + (1.0 - cfg.per_beta) * progress
        batch = self.replay.sample(cfg.batch_size, beta=beta)
        self.gradient_steps += 1
        metrics, td_errors = self.train_step(batch, progress)
        self.replay.update_priorities(batch.indices, td_errors)
        self.grad_budget -= 1.0
        return metrics

    def scalars(self, progress: float) -> dict[str, float]:
        return {"charts/gradient_steps": self.gradient_steps, "farm/replay_size": len(self.replay)}

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The learner's state, the counters and (with checkpoint_replay) the replay buffer."""
        tensors, learner = self.learner_state()
        replay_meta = None
        if self.run_config.checkpoint_replay:
            arrays, replay_meta = self.replay.state()
            tensors.update(
                prefixed("replay", {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})
            )
        return tensors, {
            "gradient_steps": self.gradient_steps,
            **learner,
            "env_steps": self.env_steps,
            "grad_budget": self.grad_budget,
            "replay": replay_meta,
        }

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        self.restore_learner(tensors, state)
        self.gradient_steps = state["gradient_steps"]
        self.env_steps, self.grad_budget = state["env_steps"], state["grad_budget"]
        if state["replay"] is not None:
            self.replay.restore({k: v.numpy() for k, v in unprefixed("replay", tensors).items()}, state["replay"])
        # else: the replay buffer was not saved (checkpoint_replay = false); it refills from new results.

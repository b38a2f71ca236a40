"""PPO with clipped surrogate objective (Schulman et al. 2017), CleanRL-style, on gathered rollouts.

SYNC only: one update per iteration, on the whole group of tasks acted with the version being trained.
`ppo.vf_loss` and `ppo.anneal_clip` give Stable-Baselines3's value loss and clip schedule instead;
tests/test_reference.py checks each PPO preset's update against the implementation it names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.algos.base import Algorithm, load_optimizer_state, optimizer_state, prefixed, to_device, unprefixed
from rlfarm.algos.ppo.acting import HEAD
from rlfarm.algos.ppo.config import VF_LOSSES
from rlfarm.algos.ppo.policies import ActorCritic, RecurrentActorCritic
from rlfarm.algos.ppo.sequences import episode_starts, seq_len_of, to_sequences
from rlfarm.config import PolicyConfig, RunConfig
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.nn.adam import Adam
from rlfarm.nn.layers import pixel_layout, place


def compute_gae(rollout: Rollout, gamma: float, gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (T, N) by generalized advantage estimation.

    The value after step t is V(obs[t+1]) while the episode runs on, V(real final obs) when it was
    truncated, 0 when it terminated, and `last_values` after the final step of the task.
    """
    values = rollout.values.astype(np.float64)
    rewards = rollout.rewards.astype(np.float64)
    dones = rollout.dones
    T = len(values)
    next_values = np.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[-1] = rollout.last_values
    next_values = np.where(dones, rollout.final_values, next_values)
    deltas = rewards + gamma * next_values - values
    advantages = np.zeros_like(values)
    last = np.zeros(values.shape[1])
    for t in reversed(range(T)):
        last = deltas[t] + gamma * gae_lambda * np.where(dones[t], 0.0, last)
        advantages[t] = last
    returns = advantages + values
    return advantages.astype(np.float32), returns.astype(np.float32)


def minibatch_starts(batch_size: int, minibatches: int) -> list[int]:
    """Where each minibatch of a batch starts, and its end: `minibatches` parts whose sizes differ by
    at most one, the larger first; parts of two samples at least while the batch has them."""
    parts = max(1, min(minibatches, batch_size // 2))
    size, extra = divmod(batch_size, parts)
    starts = [0]
    for i in range(parts):
        starts.append(starts[-1] + size + (1 if i < extra else 0))
    return starts


class PPO(Algorithm):
    """Owns the policy and its optimizer; `update` runs the minibatch epochs on one iteration."""

    name = "ppo"
    head = HEAD  # the output MLP of a saved policy (its acting module's)
    loss_keys = (
        "charts/learning_rate",
        "charts/clip_coef",
        "losses/value_loss",
        "losses/policy_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "losses/explained_variance",
        "losses/early_stopped",
    )

    @classmethod
    def build_network(cls, spec: SpaceSpec, config: PolicyConfig) -> ActorCritic | RecurrentActorCritic:
        return RecurrentActorCritic(spec, config) if config.recurrent else ActorCritic(spec, config)

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        self.policy = place(self.build_network(spec, config.policy), device)
        # fused: one kernel for all parameters; per-op overhead dominates for networks this small.
        self.optimizer = Adam(self.policy.parameters(), lr=self.config.learning_rate, eps=self.config.adam_eps)
        # Minibatch order from a private generator: reproducible, untouched by anything else.
        self.generator = torch.Generator().manual_seed(config.seed)
        # The surrogate's clip range in force (ppo.anneal_clip), set with the learning rate by `_anneal`.
        self.clip_coef = self.config.clip_coef
        self.ent_coef = self.config.ent_coef  # likewise with ppo.anneal_ent
        # ppo.precision: the dtype the network's layers run in under autocast (None: float32 throughout).
        self.autocast = torch.bfloat16 if self.config.precision == "bf16" else None
        self._rollout: Rollout | None = None
        # ppo.compile: the layers compiled for the minibatches only; the module (what is published,
        # checkpointed and exported for acting) stays as it is. Minibatch sizes are fixed: no dynamic shapes.
        self.layers = None
        if self.config.compile != "none":
            self.layers = torch.compile(self.policy._heads, mode=self.config.compile, dynamic=False)
        self.compiled = {} if self.layers is None else {"layers": self.layers}  # evaluate's keyword
        self.seq_len = config.policy.seq_len  # a recurrent policy's learning sequences (0: a whole task)
        self.burn_in = config.policy.burn_in

    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        self._rollout = rollout

    def ready(self) -> bool:
        return self._rollout is not None

    def update(self, progress: float, between: Callable[[], None] | None = None) -> dict[str, float]:
        rollout, self._rollout = self._rollout, None
        return self.train(rollout, progress_remaining=1.0 - progress)

    def train(self, rollout: Rollout, progress_remaining: float) -> dict[str, float]:
        cfg = self.config
        self._anneal(progress_remaining)
        advantages, returns = compute_gae(rollout, cfg.gamma, cfg.gae_lambda)
        metrics = self._optimize(rollout, rollout.logprobs, rollout.values, advantages, returns)
        self.update_normalizer(rollout)
        return metrics

    def update_normalizer(self, rollout: Rollout) -> None:
        """Fold the batch's observations into the running statistics, after the update: the batch was
        acted and learned with the same statistics (PPO's ratio starts at 1), the next version
        carries the new ones to the workers."""
        if self.policy.obs_norm is not None:
            obs = rollout.obs.reshape(-1, self.spec.obs_dim)
            self.policy.obs_norm.update(obs if rollout.active is None else obs[rollout.active.reshape(-1)])

    def _observations(self, rollout: Rollout) -> torch.Tensor:
        """The (T, N, ...) observations as one (T x N, ...) batch on the device, shape and dtype kept,
        images in the layout the network computes in."""
        obs = rollout.obs
        return pixel_layout(to_device(obs.reshape(obs.shape[0] * obs.shape[1], *obs.shape[2:]), self.device), self.spec)

    def _action_masks(self, rollout: Rollout) -> torch.Tensor | None:
        """The (T, N, A) legal-action masks as one (T x N, A) batch on the device, in the order of
        `_observations`; None for an env without masks."""
        masks = rollout.action_masks
        if masks is None:
            return None
        return to_device(masks.reshape(-1, masks.shape[-1]), self.device)

    def _anneal(self, progress_remaining: float) -> None:
        """Learning rate and surrogate clip range for this update, linear in the progress remaining
        (SB3's `lin_X` schedules) where anneal_lr and anneal_clip ask for it."""
        if self.config.anneal_lr:
            for group in self.optimizer.param_groups:
                group["lr"] = progress_remaining * self.config.learning_rate
        if self.config.anneal_clip:
            self.clip_coef = progress_remaining * self.config.clip_coef
        if self.config.anneal_ent:
            self.ent_coef = progress_remaining * self.config.ent_coef

    def _optimize(
        self,
        rollout: Rollout,
        logprobs: np.ndarray,
        values: np.ndarray,
        advantages: np.ndarray,
        returns: np.ndarray,
        impala_loss: bool = False,
        between: Callable[[], None] | None = None,
        is_ratios: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Minibatch epochs on (T, N) arrays, a `_step` per minibatch of samples drawn across the batch.
        `between()` runs after each minibatch (the ASYNC trainer keeps the farm fed there).
        `is_ratios` (T, N): weights on each sample's ratio (APPO's target network, `_step`)."""
        if isinstance(self.policy, RecurrentActorCritic):
            return self._optimize_sequences(
                rollout, logprobs, values, advantages, returns, impala_loss, between, is_ratios
            )
        dev = self.device
        b_obs = self._observations(rollout)
        act = rollout.actions
        b_actions = to_device(act.reshape(-1) if act.ndim == 2 else act.reshape(-1, act.shape[-1]), dev)
        b_logprobs = to_device(logprobs.reshape(-1), dev)
        b_values = to_device(values.reshape(-1), dev)
        b_adv = to_device(advantages.reshape(-1), dev)
        b_returns = to_device(returns.reshape(-1), dev)
        b_masks = self._action_masks(rollout)
        b_weights = None if is_ratios is None else to_device(is_ratios.reshape(-1), dev)
        if rollout.active is not None:  # agents out of their game: their steps teach nothing
            keep = to_device(np.flatnonzero(rollout.active.reshape(-1)), dev)
            b_obs, b_actions, b_logprobs, b_values, b_adv, b_returns = (
                x[keep] for x in (b_obs, b_actions, b_logprobs, b_values, b_adv, b_returns)
            )
            if b_masks is not None:
                b_masks = b_masks[keep]
            if b_weights is not None:
                b_weights = b_weights[keep]

        def learn(mb: torch.Tensor) -> tuple[torch.Tensor, ...]:
            mb_masks = None if b_masks is None else b_masks[mb]
            newlogprob, entropy, newvalue = self.policy.evaluate(
                b_obs[mb], b_actions[mb], mb_masks, self.autocast, **self.compiled
            )
            return self._step(
                newlogprob,
                entropy,
                newvalue,
                b_logprobs[mb],
                b_values[mb],
                b_adv[mb],
                b_returns[mb],
                impala_loss,
                None if b_weights is None else b_weights[mb],
            )

        return self._metrics(*self._epochs(len(b_obs), learn, between), b_values.cpu().numpy(), b_returns.cpu().numpy())

    def _epochs(
        self, count: int, learn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], between: Callable[[], None] | None
    ) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor], bool]:
        """ppo.update_epochs passes over `count` items (samples, or a recurrent policy's sequences) in
        a fresh order each, `learn(minibatch)` a `_step` on each minibatch; stops early past
        ppo.target_kl. Returns the last step's loss terms and approx_kl, every step's clip fraction,
        and whether it stopped early. `between()` runs after each minibatch."""
        cfg = self.config
        # A batch that is not a multiple of the minibatches (a SYNC run's shorter last iteration; the
        # steps of agents that sit out left out) is split into num_minibatches parts of sizes one
        # apart. A remainder minibatch of its own could hold one sample, whose advantage's std is NaN
        # (a two-level run's upper policy went NaN so).
        starts = minibatch_starts(count, cfg.num_minibatches)
        clipfracs: list[torch.Tensor] = []
        last: tuple[torch.Tensor, ...] = ()
        for _epoch in range(cfg.update_epochs):
            order = torch.randperm(count, generator=self.generator).to(self.device)
            for start, end in zip(starts[:-1], starts[1:]):
                last = learn(order[start:end])  # (policy, value, entropy terms, approx_kl, clip fraction)
                clipfracs.append(last[4])
                if between is not None:
                    between()
            if cfg.target_kl > 0 and last[3].item() > cfg.target_kl:
                return last[:4], clipfracs, True
        return last[:4], clipfracs, False

    def _optimize_sequences(
        self,
        rollout: Rollout,
        logprobs: np.ndarray,
        values: np.ndarray,
        advantages: np.ndarray,
        returns: np.ndarray,
        impala_loss: bool = False,
        between: Callable[[], None] | None = None,
        is_ratios: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Minibatch epochs of a recurrent policy: minibatches of whole sequences (rlfarm.algos.ppo.
        sequences), each replayed from the state its task recorded (truncated BPTT), a `_step` each.
        With policy.burn_in, each sequence's first steps refresh that state and are left out of the loss."""
        self._check_sequences(rollout)
        dev = self.device
        length = seq_len_of(len(rollout.rewards), self.seq_len)
        burn_in = self.burn_in

        def seqs(x: np.ndarray) -> torch.Tensor:
            return to_device(to_sequences(x, length), dev)

        b_obs, b_actions = seqs(rollout.obs), seqs(rollout.actions)
        b_logprobs, b_values, b_adv, b_returns = (seqs(x) for x in (logprobs, values, advantages, returns))
        b_weights = None if is_ratios is None else seqs(is_ratios)
        b_starts = episode_starts(rollout.dones, length)  # numpy: where each minibatch's fragments are cut
        b_states = to_device(rollout.states.reshape(-1, rollout.states.shape[-1]), dev)
        b_masks = None if rollout.action_masks is None else seqs(rollout.action_masks)

        def learn(mb: torch.Tensor) -> tuple[torch.Tensor, ...]:
            mb_masks = None if b_masks is None else b_masks[:, mb].reshape(-1, b_masks.shape[-1])
            outputs = self.policy.evaluate_sequences(
                b_obs[:, mb], b_actions[:, mb], b_starts[:, mb.cpu().numpy()], b_states[mb], mb_masks, burn_in
            )
            if burn_in:  # the burn-in steps teach nothing: out of the loss
                outputs = (x.reshape(length, -1)[burn_in:].reshape(-1) for x in outputs)
            targets = [x[burn_in:, mb].reshape(-1) for x in (b_logprobs, b_values, b_adv, b_returns)]
            weights = None if b_weights is None else b_weights[burn_in:, mb].reshape(-1)
            return self._step(*outputs, *targets, impala_loss, weights)

        return self._metrics(*self._epochs(len(b_states), learn, between), values.reshape(-1), returns.reshape(-1))

    def _check_sequences(self, rollout: Rollout) -> None:
        if rollout.states is None:
            raise ValueError("a recurrent policy's rollout carries the state of each sequence (Rollout.states)")
        if rollout.active is not None:
            raise ValueError("policy.recurrent with agents that sit out of their games is not built yet")

    def _metrics(
        self,
        last: tuple[torch.Tensor, ...],
        clipfracs: list[torch.Tensor],
        stopped: bool,
        y_pred: np.ndarray,
        y_true: np.ndarray,
    ) -> dict[str, float]:
        """An update's metrics: the last minibatch's loss terms, the mean clip fraction, and how much
        of the returns' variance the values the advantages were computed with explain."""
        pg_loss, v_loss, entropy_loss, approx_kl = last
        var_y = np.var(y_true)
        explained_var = float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)
        return {
            "charts/learning_rate": self.optimizer.param_groups[0]["lr"],
            "charts/clip_coef": self.clip_coef,
            "losses/value_loss": v_loss.item(),
            "losses/policy_loss": pg_loss.item(),
            "losses/entropy": entropy_loss.item(),
            "losses/approx_kl": approx_kl.item(),
            # One host sync for all minibatches' clip fractions, not one per minibatch.
            "losses/clipfrac": float(torch.stack(clipfracs).double().mean()),
            "losses/explained_variance": explained_var,
            "losses/early_stopped": float(stopped),
        }

    def _step(
        self,
        newlogprob: torch.Tensor,
        entropy: torch.Tensor,
        newvalue: torch.Tensor,
        logprobs: torch.Tensor,
        values: torch.Tensor,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        impala_loss: bool = False,
        is_ratio: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One gradient step on a minibatch's loss: the clipped surrogate against `logprobs` (or, with
        `impala_loss`, the IMPALA policy gradient -log pi(a) * advantage), the value loss towards
        `returns` (clipped around `values` with clip_vloss; its factor by vf_loss) and the entropy
        bonus. Returns the policy, value and entropy terms, approx_kl and the clip fraction.
        `is_ratio` (APPO's clip_to = "target"): a weight on the ratio pi/mu, clip(mu/pi_target)."""
        cfg = self.config
        clip = self.clip_coef  # the surrogate's, annealed with anneal_clip; the value clip stays clip_coef
        logratio = newlogprob - logprobs
        ratio = logratio.exp()
        if is_ratio is not None:
            ratio = is_ratio * ratio
            logratio = ratio.clamp_min(1e-30).log()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()  # http://joschu.net/blog/kl-approx.html
            clipfrac = ((ratio - 1.0).abs() > clip).float().mean()  # a tensor: no host sync per minibatch

        if cfg.norm_adv and len(advantages) > 1:  # (one sample has no std: its advantage is used as it is)
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        if impala_loss:
            pg_loss = -(advantages * newlogprob).mean()
        else:
            pg_loss1 = -advantages * ratio
            pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip, 1 + clip)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()

        # 0.5 (CleanRL) or 1 (SB3): at the same vf_coef SB3's value gradient is twice CleanRL's.
        factor = VF_LOSSES[cfg.vf_loss]
        if cfg.clip_vloss:
            v_loss_unclipped = (newvalue - returns) ** 2
            v_clipped = values + torch.clamp(newvalue - values, -cfg.clip_coef, cfg.clip_coef)
            v_loss = factor * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()
        else:
            v_loss = factor * ((newvalue - returns) ** 2).mean()

        entropy_loss = entropy.mean()
        loss = pg_loss - self.ent_coef * entropy_loss + v_loss * cfg.vf_coef
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
        self.optimizer.step()
        return pg_loss, v_loss, entropy_loss, approx_kl, clipfrac

    def state(self) -> dict[str, torch.Tensor]:
        """Weights the workers act with (CPU tensors)."""
        return {k: v.detach().cpu() for k, v in self.policy.state_dict().items()}

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict]:
        """Policy, optimizer and minibatch generator, for resuming (see rlfarm.trainer.resume)."""
        optim_tensors, optim_meta = optimizer_state(self.optimizer)
        tensors = {
            **prefixed("policy", self.policy.state_dict()),
            **optim_tensors,
            "rng.minibatch": self.generator.get_state(),
        }
        return tensors, {"optimizer": optim_meta}

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        self.policy.load_state_dict(unprefixed("policy", tensors))
        load_optimizer_state(self.optimizer, tensors, state["optimizer"])
        self.generator.set_state(tensors["rng.minibatch"])

"""APPO: PPO on the ASYNC farm, corrected for policy lag with V-trace (Espeholt et al. 2018, IMPALA).

Tasks act with the newest version when they start and return their behaviour log-probabilities.
The learner takes `K` results per update (`async.results_per_update`), recomputes the target
log-probabilities and values with its current network, and computes V-trace targets `vs` and
policy-gradient advantages with truncated importance weights (`ppo.rho_bar`, `ppo.c_bar`); then it
runs PPO's minibatch epochs: the clipped surrogate against the behaviour log-probabilities (or the
IMPALA policy-gradient loss, `ppo.pg_loss = "impala"`), the value loss towards `vs` and the entropy
bonus. Truncated episodes bootstrap from the behaviour critic's value of the real final observation
(the worker computes it), task ends from the learner's value of the last observation.

With `ppo.buffer_batches` B and `ppo.batch_passes` P (RLlib's circular buffer), the learner keeps the
last B batches and learns from them round robin, each P times before it leaves: an update takes the
batch under the buffer's cursor, or a new one where that slot is spent (so it waits for results only
then), and V-trace corrects for the versions published since the batch arrived.

With `ppo.clip_to = "target"` (RLlib's APPO) a target network, a copy of the network taken as every
`ppo.target_update_batches`-th new batch enters the buffer, is V-trace's target policy, and the
surrogate's ratio is clip(mu/pi_target, 0, ppo.is_ratio_clip) * pi/mu, clipped around 1 as PPO's:
each batch's passes stay near the policy the learner had when the batch came in, whatever its lag.

With `ppo.vtrace = false` the data is treated as on-policy (GAE on the behaviour values, as SYNC
does): the ablation that shows what the correction buys at high lag.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from rlfarm.algos.base import prefixed, to_device, unprefixed
from rlfarm.algos.ppo.policies import RecurrentActorCritic
from rlfarm.algos.ppo.ppo import PPO, compute_gae
from rlfarm.algos.ppo.sequences import from_sequences, next_step_starts, seq_len_of, with_next_step
from rlfarm.config import RunConfig
from rlfarm.core.rollout import Rollout, concat
from rlfarm.envs import SpaceSpec
from rlfarm.nn.layers import pixel_layout


def vtrace(
    behaviour_logprobs: np.ndarray,
    target_logprobs: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    final_values: np.ndarray,
    last_values: np.ndarray,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
    carry: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V-trace targets and policy-gradient advantages for (T, N) arrays; also the raw ratios pi/mu.

        rho_t = min(rho_bar, pi/mu),  c_t = lam * min(c_bar, pi/mu)
        delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t))
        vs_t - V(x_t) = delta_t + gamma c_t (vs_{t+1} - V(x_{t+1}))
        advantage_t = rho_t (r_t + gamma vs_{t+1} - V(x_t))

    At a step where the episode ended, V(x_{t+1}) and vs_{t+1} are `final_values` (0 when it
    terminated, the real final observation's value when truncated) and nothing flows back from the
    next episode; after the last step they are `last_values`. With rho_bar = c_bar = lam = 1 and pi = mu
    this is the n-step return to the end of the task.

    `carry` (N,): vs - V of the observation after the last step, when these T steps are a chunk whose
    continuation was computed first (0, the default, for the end of a task): chunks taken from the
    last backwards give the targets of the whole.
    """
    values_dtype = values.dtype
    ratios = np.exp(target_logprobs.astype(np.float64) - behaviour_logprobs.astype(np.float64))
    rhos = np.minimum(rho_bar, ratios)
    cs = lam * np.minimum(c_bar, ratios)
    values = values.astype(np.float64)
    rewards = rewards.astype(np.float64)
    next_values = np.empty_like(values)
    next_values[:-1] = values[1:]
    next_values[-1] = last_values
    next_values = np.where(dones, final_values, next_values)
    deltas = rhos * (rewards + gamma * next_values - values)
    vs_minus_v = np.zeros_like(values)
    after = np.zeros(values.shape[1]) if carry is None else np.asarray(carry, np.float64)
    running = after
    for t in reversed(range(len(values))):
        running = deltas[t] + gamma * cs[t] * np.where(dones[t], 0.0, running)
        vs_minus_v[t] = running
    vs = values + vs_minus_v
    next_vs = np.empty_like(vs)
    next_vs[:-1] = vs[1:]
    next_vs[-1] = last_values + after
    next_vs = np.where(dones, final_values, next_vs)
    advantages = rhos * (rewards + gamma * next_vs - values)
    # float32 as the learner's tensors, or float64 where the values are (tests/test_appo_reference.py)
    dtype = np.result_type(values_dtype, np.float32)
    return vs.astype(dtype), advantages.astype(dtype), ratios


class APPO(PPO):
    """PPO in ASYNC mode: batches of K results, V-trace, a version published after every update."""

    loss_keys = (*PPO.loss_keys, "vtrace/rho_mean", "vtrace/rho_clipped_frac", "vtrace/policy_lag_mean")

    def __init__(self, config: RunConfig, spec: SpaceSpec, device: torch.device):
        super().__init__(config, spec, device)
        self.results_per_update = max(1, config.async_.results_per_update or 1)
        self._results: list[tuple[Rollout, int]] = []
        # The circular buffer: each slot a batch and the lags its results arrived with, its updates left.
        self._slots: list[tuple[Rollout, list[int]] | None] = [None] * self.config.buffer_batches
        self._passes_left = [0] * self.config.buffer_batches
        self._cursor = 0
        # clip_to "target": the target network (no gradients) and the batches it has seen since its copy.
        self.target = None
        self._batches_since_copy = 0
        if self.config.clip_to == "target":
            self.target = copy.deepcopy(self.policy).requires_grad_(False)

    def on_farm(self, tasks_in_flight: int) -> None:
        # auto: one result from each task in flight. Fewer per update (more, smaller updates) took more
        # env steps and more time to solve CartPole (benchmarks/appo.py, 2 cores).
        if not self.run_config.async_.results_per_update:
            self.results_per_update = max(1, tasks_in_flight)

    @property
    def publish_every(self) -> int:
        return 1  # every update is a batch of whole results: publish it, so lag stays small

    def batch_results(self) -> int:
        return self.results_per_update

    def versions_per_result(self) -> float:
        return self.config.batch_passes / self.results_per_update

    def observe(self, rollout: Rollout, policy_lag: int) -> None:
        self._results.append((rollout, policy_lag))

    def ready(self) -> bool:
        return self._passes_left[self._cursor] > 0 or len(self._results) >= self.results_per_update

    def update(self, progress: float, between: Callable[[], None] | None = None) -> dict[str, float]:
        cfg = self.config
        slot = self._cursor
        fresh = self._passes_left[slot] == 0
        if fresh:  # the slot is spent: a new batch of results takes it
            taken, self._results = self._results[: self.results_per_update], self._results[self.results_per_update :]
            self._slots[slot] = (concat([r for r, _ in taken]), [lag for _, lag in taken])
            self._passes_left[slot] = cfg.batch_passes
            if self.target is not None:  # RLlib copies its target network after each training step's batch
                self._batches_since_copy += 1
                if self._batches_since_copy >= cfg.target_update_batches:
                    self.target.load_state_dict(self.policy.state_dict())
                    self._batches_since_copy = 0
        rollout, lags = self._slots[slot]  # type: ignore[misc]
        self._passes_left[slot] -= 1
        self._cursor = (slot + 1) % cfg.buffer_batches
        if self._passes_left[slot] == 0:
            self._slots[slot] = None  # spent: its memory goes now
        self._anneal(1.0 - progress)
        if self._one_pass(rollout):
            metrics, ratios = self._learn_in_one_pass(rollout, between)
        else:
            metrics, ratios = self._learn_after_targets(rollout, between)
        if fresh:  # observation statistics take each batch in once
            self.update_normalizer(rollout)
        metrics["vtrace/rho_mean"] = float(np.minimum(cfg.rho_bar, ratios).mean())
        # (a hair above rho_bar: numpy acting and torch learning differ in the last float bits)
        metrics["vtrace/rho_clipped_frac"] = float((ratios > cfg.rho_bar * (1 + 1e-5)).mean())
        metrics["vtrace/policy_lag_mean"] = float(np.mean(lags))
        return metrics

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict]:
        """PPO's, and the circular buffer's batches still to be learned from (with buffer_batches > 1)."""
        tensors, state = super().checkpoint()
        slots = []
        for i, slot in enumerate(self._slots):
            if slot is None:
                slots.append(None)
                continue
            rollout, lags = slot
            fields = [name for name, value in rollout.to_dict().items() if value is not None]
            tensors.update(
                {
                    f"appo.slot{i}.{name}": torch.from_numpy(np.ascontiguousarray(getattr(rollout, name)))
                    for name in fields
                }
            )
            slots.append({"fields": fields, "lags": list(lags)})
        if self.target is not None:
            tensors.update(prefixed("target", self.target.state_dict()))
            state = {**state, "target_batches": self._batches_since_copy}
        return tensors, {
            **state,
            "buffer": {"slots": slots, "passes_left": list(self._passes_left), "cursor": self._cursor},
        }

    def restore(self, tensors: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> None:
        super().restore(tensors, state)
        if self.target is not None:  # (a checkpoint without one: the target starts as the network)
            saved = unprefixed("target", tensors)
            self.target.load_state_dict(saved if saved else self.policy.state_dict())
            self._batches_since_copy = int(state.get("target_batches", 0))
        buffer = state.get("buffer")
        if not buffer or len(buffer["slots"]) != len(self._slots):  # (another buffer size: start it empty)
            return
        for i, slot in enumerate(buffer["slots"]):
            self._slots[i] = (
                None
                if slot is None
                else (
                    Rollout.from_dict({name: tensors[f"appo.slot{i}.{name}"].numpy() for name in slot["fields"]}),
                    list(slot["lags"]),
                )
            )
        self._passes_left = [int(n) for n in buffer["passes_left"]]
        self._cursor = int(buffer["cursor"])

    def _one_pass(self, rollout: Rollout) -> bool:
        """Whether this batch is learned as IMPALA learns: one pass (update_epochs = 1), V-trace
        computed inside each minibatch from the same forward as its loss."""
        cfg = self.config
        steps = rollout.rewards.shape[0]
        return (
            cfg.update_epochs == 1
            and cfg.vtrace
            and rollout.last_obs is not None
            and steps % cfg.num_minibatches == 0
            and rollout.active is None  # agents out of their game: the two-pass path leaves their steps out
            and not isinstance(self.policy, RecurrentActorCritic)  # (sequences replay in the two-pass path)
        )

    def _learn_in_one_pass(
        self, rollout: Rollout, between: Callable[[], None] | None
    ) -> tuple[dict[str, float], np.ndarray]:
        """update_epochs = 1: the batch's T steps are cut into num_minibatches chunks of time, each
        holding every trajectory (so a minibatch's advantages are normalised across all the batch's
        envs, not one env's stretch without a point scored), learned from the last chunk backwards.
        One forward gives the target log-probabilities and values V-trace needs (detached) and the
        loss's, so a sample costs one forward-backward; the two-pass path pays one more forward over
        the whole batch first (benchmarks/learner.py). Each chunk bootstraps from the values of the
        chunk after it, computed one gradient step earlier, and continues its V-trace recursion
        (`carry`); the last from the observations after the task. Targets come from the network as
        it is when the chunk's turn comes, as in IMPALA."""
        cfg = self.config
        T, N = rollout.rewards.shape
        chunk = T // cfg.num_minibatches
        act = rollout.actions
        masks = rollout.action_masks
        dev = self.device
        clipfracs, ratios, values_seen, returns_seen = [], [], [], []
        boot, carry = None, np.zeros(N)
        for start in reversed(range(0, T, chunk)):
            rows = slice(start, start + chunk)
            steps = chunk * N
            obs = rollout.obs[rows].reshape(steps, *rollout.obs.shape[2:])
            actions = act[rows].reshape(steps, *act.shape[2:])
            mask = None if masks is None else masks[rows].reshape(steps, masks.shape[-1])
            if boot is None:  # the last chunk: its bootstrap values come from this forward too
                obs = np.concatenate([obs, rollout.last_obs])
                actions = np.concatenate([actions, np.zeros((N, *act.shape[2:]), actions.dtype)])
                if mask is not None:  # (only their values are used: any mask will do)
                    mask = np.concatenate([mask, np.ones((N, masks.shape[-1]), bool)])
            # on the device once: the target network's forward takes the same tensors
            obs, actions = pixel_layout(to_device(obs, dev), self.spec), to_device(actions, dev)
            mask = None if mask is None else to_device(mask, dev)
            logprob, entropy, value = self.policy.evaluate(obs, actions, mask, self.autocast, **self.compiled)
            newlogprob, entropy, newvalue = logprob[:steps], entropy[:steps], value[:steps]
            if boot is None:
                boot = value[steps:].detach().cpu().numpy().astype(np.float64)
            if self.target is None:
                target = newlogprob.detach().cpu().numpy().reshape(chunk, N)
            else:
                target = self._target_logprobs(obs[:steps], actions[:steps], None if mask is None else mask[:steps])
                target = target.reshape(chunk, N)
            values = newvalue.detach().cpu().numpy().reshape(chunk, N)
            behaviour = rollout.logprobs[rows]
            vs, advantages, raw = vtrace(
                behaviour,
                target,
                rollout.rewards[rows],
                values,
                rollout.dones[rows],
                rollout.final_values[rows],
                boot,
                cfg.gamma,
                cfg.rho_bar,
                cfg.c_bar,
                cfg.gae_lambda,
                carry=carry,
            )
            boot, carry = values[0].astype(np.float64), vs[0].astype(np.float64) - values[0]
            clip_around = target if cfg.clip_to == "proximal" else behaviour
            last = self._step(
                newlogprob,
                entropy,
                newvalue,
                to_device(clip_around.reshape(-1), dev),
                to_device(values.reshape(-1), dev),
                to_device(advantages.reshape(-1), dev),
                to_device(vs.reshape(-1), dev),
                impala_loss=cfg.pg_loss == "impala",
                is_ratio=None if self.target is None else to_device(self._is_ratios(behaviour, target).ravel(), dev),
            )
            clipfracs.append(last[-1])
            ratios.append(raw.reshape(-1))
            values_seen.append(values.reshape(-1))
            returns_seen.append(vs.reshape(-1))
            if between is not None:
                between()
        metrics = self._metrics(last[:4], clipfracs, False, np.concatenate(values_seen), np.concatenate(returns_seen))
        return metrics, np.concatenate(ratios)

    def _learn_after_targets(
        self, rollout: Rollout, between: Callable[[], None] | None
    ) -> tuple[dict[str, float], np.ndarray]:
        """Targets for the whole batch from the network as the update begins, then PPO's epochs."""
        cfg = self.config
        target_logprobs, values, last_values = self._evaluate(rollout)
        if self.target is not None and isinstance(self.target, RecurrentActorCritic):
            target_logprobs = self._replay(self.target, rollout)[0]
        elif self.target is not None:  # V-trace's target policy is the target network; the values stay the network's
            T, N = rollout.rewards.shape
            act = rollout.actions
            target_logprobs = self._target_logprobs(
                self._observations(rollout),
                to_device(act.reshape(T * N, *act.shape[2:]), self.device),
                self._action_masks(rollout),
            ).reshape(T, N)
        if cfg.vtrace:
            returns, advantages, ratios = vtrace(
                rollout.logprobs,
                target_logprobs,
                rollout.rewards,
                values,
                rollout.dones,
                rollout.final_values,
                last_values,
                cfg.gamma,
                cfg.rho_bar,
                cfg.c_bar,
                cfg.gae_lambda,
            )
        else:  # the ablation: lagged data taken as on-policy
            values = rollout.values
            advantages, returns = compute_gae(rollout, cfg.gamma, cfg.gae_lambda)
            ratios = np.exp(target_logprobs.astype(np.float64) - rollout.logprobs)
        # clip_to "behaviour" (APPO): clipping also bounds how far an update moves from what acted, but
        # a lagged result starts its update already clipped in part (PPO's epochs at a lag of 2 on
        # Pong: half the samples). "proximal" (decoupled PPO): the ratio starts at 1 whatever the lag,
        # and V-trace's advantages already carry the truncated weight min(rho_bar, pi/mu). On CartPole it
        # solved faster at low lag but collapsed in one of five runs at a lag of 10 (benchmarks/appo.py).
        clip_around = target_logprobs if cfg.clip_to == "proximal" else rollout.logprobs
        metrics = self._optimize(
            rollout,
            clip_around,
            values,
            advantages,
            returns,
            impala_loss=cfg.pg_loss == "impala",
            between=between,
            is_ratios=None if self.target is None else self._is_ratios(rollout.logprobs, target_logprobs),
        )
        return metrics, ratios

    @torch.no_grad()
    def _replay(self, net: RecurrentActorCritic, rollout: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A recurrent `net`'s log-probabilities and values (T, N) of the rollout's steps, each sequence
        replayed from its recorded state (with policy.burn_in as the learner replays it), and its
        values of the observations after the task (N,), each the step after the task's last sequence
        (the worker's own where the rollout has no last_obs)."""
        self._check_sequences(rollout)
        T, N = rollout.rewards.shape
        length = seq_len_of(T, self.seq_len)
        last_obs = rollout.obs[-1] if rollout.last_obs is None else rollout.last_obs  # (a stand-in, unused)
        obs = to_device(with_next_step(rollout.obs, last_obs, length), self.device)
        act = rollout.actions
        actions = to_device(with_next_step(act, np.zeros_like(act[0]), length), self.device)
        masks = rollout.action_masks
        if masks is not None:  # (the step after a sequence: only its value is used, any mask will do)
            masks = with_next_step(masks, np.ones_like(masks[0]), length)
            masks = to_device(masks.reshape(-1, masks.shape[-1]), self.device)
        states = to_device(rollout.states.reshape(-1, rollout.states.shape[-1]), self.device)
        starts = next_step_starts(rollout.dones, length)
        logprobs, _, values = net.evaluate_sequences(obs, actions, starts, states, masks, self.burn_in)
        logprobs, values = (x.cpu().numpy().reshape(length + 1, -1) for x in (logprobs, values))
        last_values = values[length].reshape(-1, N)[-1] if rollout.last_obs is not None else rollout.last_values
        return (
            from_sequences(logprobs[:length], N),
            from_sequences(values[:length], N),
            np.asarray(last_values, np.float64),
        )

    def _is_ratios(self, behaviour: np.ndarray, target: np.ndarray) -> np.ndarray:
        """RLlib's is_ratio: mu/pi_target clipped to [0, is_ratio_clip], in the learner's precision."""
        ratio = np.exp(behaviour.astype(np.float64) - target.astype(np.float64))
        return np.clip(ratio, 0.0, self.config.is_ratio_clip).astype(np.result_type(target.dtype, np.float32))

    @torch.no_grad()
    def _target_logprobs(self, obs: torch.Tensor, actions: torch.Tensor, mask: torch.Tensor | None) -> np.ndarray:
        """Log-probabilities of the behaviour's actions under the target network (flat, numpy), from
        tensors already on the device."""
        logprob, _, _ = self.target.evaluate(obs, actions, mask, self.autocast)
        return logprob.cpu().numpy()

    @torch.no_grad()
    def _evaluate(self, rollout: Rollout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Target log-probabilities and values (T, N) of the behaviour's actions under the current
        network, and its values of the observations after the last step (N,). A recurrent network
        replays each sequence from the state its task recorded (`_replay`)."""
        if isinstance(self.policy, RecurrentActorCritic):
            return self._replay(self.policy, rollout)
        T, N = rollout.rewards.shape
        obs = self._observations(rollout)
        act = rollout.actions
        actions = to_device(act.reshape(T * N, *act.shape[2:]), self.device)
        logprobs, _, values = self.policy.evaluate(obs, actions, self._action_masks(rollout), self.autocast)
        if rollout.last_obs is None:  # a result from a worker that does not send it
            last_values = rollout.last_values
        else:
            last_values = self.policy.get_value(to_device(rollout.last_obs, self.device)).cpu().numpy()
        return (
            logprobs.cpu().numpy().reshape(T, N),
            values.cpu().numpy().reshape(T, N),
            np.asarray(last_values, np.float64),
        )

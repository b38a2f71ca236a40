"""PPO's actors without torch (PURE: numpy): sampling from the policy's categorical or diagonal-Gaussian
distribution, and the numpy actor of an MLP `ActorCritic` (rlfarm.algos.ppo.policies), built from its
saved tensors alone, so a worker acting it never imports torch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlfarm.config import PolicyConfig
from rlfarm.envs import SpaceSpec
from rlfarm.nn.acting import (
    Actor,
    masked_sample,
    mlp_steps,
    normalizer,
    run_numpy_mlp,
    tensor,
)
from rlfarm.nn.memory import NumpyMemory

HEAD = "actor"  # the output MLP of a saved policy: its sizes are read from it (rlfarm.algos.saved)


class PolicyActor(Actor):
    """Samples from the policy's distribution with a numpy generator; subclasses compute the outputs."""

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits or Gaussian means, state values) for a batch."""
        raise NotImplementedError

    def value(self, obs: np.ndarray) -> np.ndarray:
        return self._outputs(obs)[1]

    def act(
        self, obs: np.ndarray, rng: np.random.Generator, deterministic: bool = False, mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions (as stored: unclipped), their log-probabilities and state values, for a batch.
        `mask`: the legal actions; the others get probability 0 (their logits -inf)."""
        out, value = self._outputs(obs)
        out = out.astype(np.float64)
        if self.spec.discrete:
            if mask is not None:
                out = np.where(mask, out, -np.inf)
            logp = out - out.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            if deterministic:
                action = logp.argmax(-1)
            elif mask is None:
                # Inverse-CDF sampling from the numpy generator.
                cdf = np.exp(logp).cumsum(-1)
                u = rng.random((len(cdf), 1)) * cdf[:, -1:]
                action = np.minimum((cdf < u).sum(-1), self.spec.action_dim - 1)
            else:
                action = masked_sample(np.exp(logp), mask, rng)
            logprob = logp[np.arange(len(action)), action].astype(np.float32)
            return action.astype(np.int64), logprob, value
        mean = out.astype(np.float32)
        if deterministic:
            action = mean
        else:
            action = (mean + self.std * rng.standard_normal(mean.shape)).astype(np.float32)
        z = (action - mean) / self.std
        logprob = (-0.5 * z * z - self.log_std - 0.5 * np.log(2 * np.pi)).sum(-1).astype(np.float32)
        return action, logprob, value

    def _gaussian(self, log_std: np.ndarray | None) -> None:
        """A Gaussian policy's state-independent log-std (the saved `actor_logstd`)."""
        if not self.spec.discrete:
            self.log_std = np.asarray(log_std).reshape(-1).astype(np.float32)
            self.std = np.exp(self.log_std)


class NumpyActor(PolicyActor):
    """Acts with numpy copies of an MLP ActorCritic's weights (several times faster than torch for one
    small batch per env step): its `actor.*`, `critic.*`, `obs_norm.*` and `actor_logstd` tensors."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]):
        self.spec = spec
        hidden = list(config.hidden_sizes)
        self.actor = mlp_steps(state, "actor", [spec.obs_dim, *hidden, spec.action_dim], config.activation)
        self.critic = mlp_steps(state, "critic", [spec.obs_dim, *hidden, 1], config.activation)
        self.normalize = normalizer(state, spec, config)
        self._gaussian(None if spec.discrete else tensor(state, "actor_logstd", (1, spec.action_dim)))

    def value(self, obs: np.ndarray) -> np.ndarray:
        if self.normalize is not None:
            obs = self.normalize(obs)
        return run_numpy_mlp(self.critic, obs)[:, 0]

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = self.normalize(obs) if self.normalize is not None else obs
        return run_numpy_mlp(self.actor, x), run_numpy_mlp(self.critic, x)[:, 0]


class RecurrentPolicyActor(PolicyActor):
    """What every recurrent actor shares (rlfarm.nn.acting.Actor): the cores' state, one row per sub-env,
    set by `begin`, zeroed by `episodes_started`, advanced by `act` and left alone by `value`. A subclass
    sets `width` and `seq_len` and computes one step, `_step(obs, state) -> (out, value, next state)`."""

    recurrent = True
    width = 0

    def _carry(self, seq_len: int, width: int) -> None:
        """Set up the state: `width` floats a sub-env, sequences of `seq_len` steps (Rollout.states)."""
        self.seq_len, self.width = seq_len, width
        self.state = np.zeros((0, width), np.float32)

    def begin(self, n: int, state: np.ndarray | None = None) -> None:
        width = self.width
        if state is None:
            self.state = np.zeros((n, width), np.float32)
        elif np.shape(state) != (n, width):
            raise ValueError(f"a recurrent state of shape {list(np.shape(state))}, this actor's is [{n}, {width}]")
        else:
            self.state = np.array(state, np.float32)

    def episodes_started(self, rows: np.ndarray) -> None:
        self.state[rows] = 0.0

    def _step(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out, value, self.state = self._step(obs, self.state)
        return out, value

    def value(self, obs: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """State values of `obs` after the state of the batch (or of its rows `rows`), which stays."""
        return self._step(obs, self.state if rows is None else self.state[rows])[1]


class RecurrentNumpyActor(RecurrentPolicyActor):
    """Acts with numpy copies of a RecurrentActorCritic's weights (`memory.rnn.*`, `actor.*`, `critic.*`,
    `critic_memory.rnn.*`), carrying the cores' state from step to step (rlfarm.nn.acting.Actor). Vector
    observations; an image policy's actors are torch's or ONNX Runtime's (rlfarm.algos.ppo.policies)."""

    def __init__(self, spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]):
        self.spec = spec
        size, hidden = config.recurrent_size, list(config.hidden_sizes)
        self.memory = NumpyMemory(state, "memory.rnn", config.recurrent, spec.obs_dim, size)
        self.critic_memory = None  # policy.critic_core: the critic's own core, its state after the actor's
        if config.critic_core:
            self.critic_memory = NumpyMemory(state, "critic_memory.rnn", config.recurrent, spec.obs_dim, size)
        self.actor = mlp_steps(state, "actor", [size, *hidden, spec.action_dim], config.activation)
        self.critic = mlp_steps(state, "critic", [size, *hidden, 1], config.activation)
        self.normalize = normalizer(state, spec, config)
        self._gaussian(None if spec.discrete else tensor(state, "actor_logstd", (1, spec.action_dim)))
        self._carry(config.seq_len, self.memory.state_size * (2 if config.critic_core else 1))

    def _features(self, obs: np.ndarray) -> np.ndarray:
        return self.normalize(obs) if self.normalize is not None else obs

    def _outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, width = self._features(obs), self.memory.state_size
        out, mine = self.memory(x, self.state[:, :width])
        if self.critic_memory is None:
            self.state = mine
            return run_numpy_mlp(self.actor, out), run_numpy_mlp(self.critic, out)[:, 0]
        valued, theirs = self.critic_memory(x, self.state[:, width:])
        self.state = np.concatenate([mine, theirs], axis=1)
        return run_numpy_mlp(self.actor, out), run_numpy_mlp(self.critic, valued)[:, 0]

    def value(self, obs: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """State values of `obs` after the state of the batch (or of its rows `rows`), which stays: the
        critic's core only."""
        state = self.state if rows is None else self.state[rows]
        core, width = (self.memory, 0) if self.critic_memory is None else (self.critic_memory, self.memory.state_size)
        valued, _ = core(self._features(obs), state[:, width:])
        return run_numpy_mlp(self.critic, valued)[:, 0]


def numpy_actor(spec: SpaceSpec, config: PolicyConfig, state: Mapping[str, np.ndarray]) -> PolicyActor:
    if config.recurrent:
        return RecurrentNumpyActor(spec, config, state)
    return NumpyActor(spec, config, state)

"""Replay buffers for off-policy learning (PURE: numpy only).

- `nstep_transitions` turns one task's (T, N) rollout into flat n-step transitions.
- `ReplayBuffer`: a ring buffer with uniform sampling.
- `PrioritizedReplayBuffer`: proportional prioritisation (Schaul et al. 2016) on a sum tree, with
  importance-sampling weights; the learner updates priorities after each batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlfarm.core.rollout import Rollout


@dataclass
class Transitions:
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray  # n-step discounted sum
    next_obs: np.ndarray  # observation n steps later (the real final one if the episode ended)
    dones: np.ndarray  # terminated within the n steps: no bootstrap
    discounts: np.ndarray  # gamma ** (steps actually taken)
    # (SpaceSpec.action_mask) the actions legal at next_obs, what the target maximises over; else None
    next_action_masks: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rewards)


def nstep_transitions(rollout: Rollout, n: int, gamma: float) -> Transitions:
    """n-step transitions of every step of a rollout; windows stop at episode ends and task ends."""
    assert rollout.next_obs is not None and rollout.terminations is not None, "collect(keep_next_obs=True)"
    T, N = rollout.rewards.shape
    rewards = np.zeros((T, N), np.float64)
    discount = np.ones((T, N), np.float64)
    next_obs = np.empty_like(rollout.next_obs)
    dones = np.zeros((T, N), bool)
    active = np.ones((T, N), bool)  # window still open
    last = np.zeros((T, N), np.int64)
    for k in range(n):
        idx = np.arange(T) + k
        valid = (idx < T)[:, None] & active
        src = np.minimum(idx, T - 1)
        r_k = rollout.rewards[src]
        rewards += np.where(valid, discount * r_k, 0.0)
        discount = np.where(valid, discount * gamma, discount)
        last = np.where(valid, src[:, None], last)
        ended = rollout.dones[src]
        dones |= valid & rollout.terminations[src]
        active = valid & ~ended
    cols = np.arange(N)[None, :]
    next_obs = rollout.next_obs[last, cols]
    # The legal actions go with the observation they are legal at: the n-step next_obs's.
    next_masks = None if rollout.next_action_masks is None else rollout.next_action_masks[last, cols]
    if rollout.active is not None:  # agents out of their game (rlfarm.envs.agents): no transition
        keep = rollout.active
        return Transitions(
            rollout.obs[keep],
            rollout.actions[keep],
            rewards[keep].astype(np.float32),
            next_obs[keep],
            dones[keep],
            discount[keep].astype(np.float32),
            None if next_masks is None else next_masks[keep],
        )
    flat = lambda a: a.reshape(T * N, *a.shape[2:])  # noqa: E731
    return Transitions(
        flat(rollout.obs),
        flat(rollout.actions),
        flat(rewards).astype(np.float32),
        flat(next_obs),
        flat(dones),
        flat(discount).astype(np.float32),
        None if next_masks is None else flat(next_masks),
    )


@dataclass
class Batch:
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    dones: np.ndarray
    discounts: np.ndarray
    weights: np.ndarray  # importance-sampling weights (ones for uniform replay)
    indices: np.ndarray
    next_action_masks: np.ndarray | None = None  # (batch, action_dim) bool, for envs with action masks


class ReplayBuffer:
    """Observations are stored with their shape and dtype (uint8 images stay uint8: 4x less memory)."""

    def __init__(
        self,
        capacity: int,
        obs_shape: int | tuple[int, ...],
        action_shape: tuple[int, ...] = (),
        action_dtype: type = np.int64,
        seed: int = 0,
        obs_dtype: type | str = np.float32,
    ):
        shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.capacity = capacity
        self.obs = np.zeros((capacity, *shape), obs_dtype)
        self.next_obs = np.zeros((capacity, *shape), obs_dtype)
        self.actions = np.zeros((capacity, *action_shape), action_dtype)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, bool)
        self.discounts = np.zeros(capacity, np.float32)
        # (capacity, action_dim) bool, allocated by the first transitions that carry masks (SpaceSpec.action_mask)
        self.next_action_masks: np.ndarray | None = None
        self.pos = 0
        self.size = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def add(self, t: Transitions) -> np.ndarray:
        """Store a batch of transitions, overwriting the oldest; returns their slots."""
        n = len(t)
        if n > self.capacity:  # keep the newest
            t = Transitions(**{f: None if v is None else v[-self.capacity :] for f, v in vars(t).items()})
            n = self.capacity
        slots = (self.pos + np.arange(n)) % self.capacity
        self.obs[slots], self.next_obs[slots] = t.obs, t.next_obs
        self.actions[slots], self.rewards[slots] = t.actions, t.rewards
        self.dones[slots], self.discounts[slots] = t.dones, t.discounts
        if t.next_action_masks is not None:
            if self.next_action_masks is None:
                self.next_action_masks = np.ones((self.capacity, t.next_action_masks.shape[-1]), bool)
            self.next_action_masks[slots] = t.next_action_masks
        elif self.next_action_masks is not None:  # transitions without masks: every action legal
            self.next_action_masks[slots] = True
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        return slots

    def _batch(self, idx: np.ndarray, weights: np.ndarray) -> Batch:
        return Batch(
            self.obs[idx],
            self.actions[idx],
            self.rewards[idx],
            self.next_obs[idx],
            self.dones[idx],
            self.discounts[idx],
            weights.astype(np.float32),
            idx,
            None if self.next_action_masks is None else self.next_action_masks[idx],
        )

    def sample(self, batch_size: int, beta: float = 0.0) -> Batch:
        idx = self.rng.integers(0, self.size, batch_size)
        return self._batch(idx, np.ones(batch_size))

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        """Uniform replay has no priorities."""

    _FIELDS = ("obs", "next_obs", "actions", "rewards", "dones", "discounts")

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """The stored part of the buffer and its position and sampler state (for resuming a run)."""
        arrays = {f: getattr(self, f)[: self.size] for f in self._FIELDS}
        if self.next_action_masks is not None:
            arrays["next_action_masks"] = self.next_action_masks[: self.size]
        return arrays, {"pos": self.pos, "size": self.size, "rng": self.rng.bit_generator.state}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        size = meta["size"]
        if size > self.capacity:
            raise ValueError(f"saved replay holds {size} transitions, more than buffer_size {self.capacity}")
        for f in self._FIELDS:
            getattr(self, f)[:size] = arrays[f]
        if "next_action_masks" in arrays:
            masks = arrays["next_action_masks"]
            self.next_action_masks = np.ones((self.capacity, masks.shape[-1]), bool)
            self.next_action_masks[:size] = masks
        self.pos, self.size = meta["pos"] % self.capacity, size
        self.rng.bit_generator.state = meta["rng"]


class SumTree:
    """Binary tree over `capacity` leaves whose nodes hold the sum of their children."""

    def __init__(self, capacity: int):
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        node = np.asarray(idx) + self.leaves
        self.tree[node] = values
        # Repeated parents just write the same sum twice, so no de-duplication is needed.
        for _ in range(self.leaves.bit_length() - 1):
            node = node // 2
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(idx) + self.leaves]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Leaf index whose cumulative-sum interval contains each value (vectorised descent)."""
        node = np.ones(len(values), np.int64)
        values = values.astype(np.float64).copy()
        while node[0] < self.leaves:
            left = 2 * node
            go_right = values > self.tree[left]
            values -= np.where(go_right, self.tree[left], 0.0)
            node = np.where(go_right, left + 1, left)
        return node - self.leaves


class PrioritizedReplayBuffer(ReplayBuffer):
    """P(i) = p_i^alpha / sum_k p_k^alpha; weight w_i = (N P(i))^-beta / max_j w_j (over the batch)."""

    def __init__(
        self,
        capacity: int,
        obs_shape: int | tuple[int, ...],
        action_shape: tuple[int, ...] = (),
        action_dtype: type = np.int64,
        seed: int = 0,
        alpha: float = 0.6,
        eps: float = 1e-6,
        obs_dtype: type | str = np.float32,
    ):
        super().__init__(capacity, obs_shape, action_shape, action_dtype, seed, obs_dtype)
        self.alpha = alpha
        self.eps = eps
        self.tree = SumTree(capacity)
        self.max_priority = 1.0  # new transitions get the highest priority seen: replayed soon

    def add(self, t: Transitions) -> np.ndarray:
        slots = super().add(t)
        self.tree.set(slots, np.full(len(slots), self.max_priority**self.alpha))
        return slots

    def sample(self, batch_size: int, beta: float = 0.4) -> Batch:
        total = self.tree.total
        # Stratified: one uniform draw in each of batch_size equal segments of the total mass.
        bounds = np.linspace(0.0, total, batch_size + 1)
        values = self.rng.uniform(bounds[:-1], bounds[1:])
        idx = np.minimum(self.tree.find(values), self.size - 1)
        probs = self.tree.get(idx) / total
        weights = (self.size * probs) ** (-beta)
        return self._batch(idx, weights / weights.max())

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays, meta = super().state()
        arrays["priorities"] = self.tree.get(np.arange(self.size))
        return arrays, {**meta, "max_priority": self.max_priority}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        super().restore(arrays, meta)
        self.tree.set(np.arange(meta["size"]), arrays["priorities"])
        self.max_priority = meta["max_priority"]

    def update_priorities(self, indices: np.ndarray, td_errors: np.ndarray) -> None:
        priorities = np.abs(td_errors) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max()))
        self.tree.set(indices, priorities**self.alpha)

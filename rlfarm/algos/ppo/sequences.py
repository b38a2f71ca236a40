"""A recurrent policy's batch as sequences (PURE: numpy): the (T, N) arrays of a rollout cut into K
sequences of L steps per sub-env, K x N sequences in all, numbered k x N + n (the order of
Rollout.states, (K, N, S) read as (K x N, S)). Truncated BPTT runs over each from the state its task
recorded for it; an episode that starts inside one zeroes the state there, as the actor did.
"""

from __future__ import annotations

import numpy as np


def seq_len_of(steps: int, seq_len: int) -> int:
    """The steps of one sequence in a batch of `steps` per sub-env (policy.seq_len; 0: all of them)."""
    length = seq_len or steps
    if steps % length:
        raise ValueError(f"a batch of {steps} steps per sub-env is not whole sequences of {length}")
    return length


def to_sequences(x: np.ndarray, length: int) -> np.ndarray:
    """(T, N, ...) -> (L, K x N, ...): step t of sequence k x N + n is x[k x L + t, n]."""
    steps, n = x.shape[:2]
    k = steps // length
    return x.reshape(k, length, n, *x.shape[2:]).swapaxes(0, 1).reshape(length, k * n, *x.shape[2:])


def episode_starts(dones: np.ndarray, length: int) -> np.ndarray:
    """(L, K x N) bool: an episode starts at that step of a sequence (the step before it ended one).
    A sequence's first step is never marked: the state recorded for it already is an episode's start."""
    before = np.zeros_like(dones)
    before[1:] = dones[:-1]
    starts = to_sequences(before, length)
    starts[0] = False
    return starts


def from_sequences(x: np.ndarray, n: int) -> np.ndarray:
    """(L, K x N, ...) -> (T, N, ...): to_sequences undone, for `n` sub-envs."""
    length, count = x.shape[:2]
    k = count // n
    return x.reshape(length, k, n, *x.shape[2:]).swapaxes(0, 1).reshape(k * length, n, *x.shape[2:])


def with_next_step(x: np.ndarray, after: np.ndarray, length: int) -> np.ndarray:
    """(T, N, ...) and the (N, ...) after the last step -> (L + 1, K x N, ...): each sequence and the
    step after it (the next sequence's first, or `after` for the task's last)."""
    following = np.concatenate([x, after[None]])[length::length]  # rows L, 2L, ..., T: (K, N, ...)
    return np.concatenate([to_sequences(x, length), following.reshape(1, -1, *x.shape[2:])])


def next_step_starts(dones: np.ndarray, length: int) -> np.ndarray:
    """episode_starts for with_next_step's (L + 1, K x N): the step after a sequence starts an episode
    where the sequence's last step ended one."""
    return np.concatenate([episode_starts(dones, length), dones[length - 1 :: length].reshape(1, -1)])

"""Observation normalisation that travels with the policy (PURE: torch and numpy).

A network's `ObsNormalizer` holds running mean, variance and count as buffers, so they are part of
its state dict: published with every version, loaded by the workers' actors, saved in checkpoints.
Workers and learner therefore normalise with the same statistics for a given version; only the
learner updates them, from the observations of the results it consumes (a worker normalising with
other statistics than the learner is a classic, silent distributed-RL bug).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlfarm.nn.acting import EPS


def combine(mean: np.ndarray, var: np.ndarray, count: float, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Running (mean, var, count) with a batch (rows = samples) folded in: the parallel algorithm of
    Chan et al. (1979), exact for any batch sizes, in float64."""
    batch = batch.astype(np.float64).reshape(-1, mean.shape[0])
    n = batch.shape[0]
    if n == 0:
        return mean, var, count
    b_mean, b_var = batch.mean(0), batch.var(0)
    total = count + n
    delta = b_mean - mean
    new_mean = mean + delta * n / total
    m2 = var * count + b_var * n + delta**2 * count * n / total
    return new_mean, m2 / total, total


class ObsNormalizer(nn.Module):
    """(obs - mean) / sqrt(var + eps), clipped to [-clip, clip]. Starts as the identity-like (0, 1)."""

    def __init__(self, size: int, clip: float = 10.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.zeros(1, dtype=torch.float64))  # (1,): safetensors digests need a dimension

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(obs.dtype), torch.sqrt(self.var + EPS).to(obs.dtype)
        return ((obs - mean) / std).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: np.ndarray) -> None:
        mean, var, count = combine(self.mean.cpu().numpy(), self.var.cpu().numpy(), float(self.count), obs)
        self.mean.copy_(torch.from_numpy(mean))
        self.var.copy_(torch.from_numpy(var))
        self.count.fill_(count)

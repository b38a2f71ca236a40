"""A recurrent core's step without torch (PURE: numpy): one step of a one-layer torch.nn.LSTM or GRU,
read from its saved tensors (`<prefix>.weight_ih_l0`, `weight_hh_l0`, `bias_ih_l0`, `bias_hh_l0`), so
a worker acting a recurrent MLP policy never imports torch.

A core's state is one float32 array per batch row: an LSTM's hidden and cell state side by side
(h | c, 2 x size), a GRU's hidden state (size). Zeros are an episode's start. rlfarm.nn.recurrent is
the torch side, with the same gate order and the same state layout.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from rlfarm.nn.acting import tensor

KINDS = ("lstm", "gru")
GATES = {"lstm": 4, "gru": 3}  # torch's gate blocks: LSTM i, f, g, o; GRU r, z, n


def state_size(kind: str, size: int) -> int:
    """Floats of state per batch row: an LSTM carries h and c, a GRU h."""
    return 2 * size if kind == "lstm" else size


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class NumpyMemory:
    """One step of a saved one-layer LSTM or GRU (`prefix`.weight_ih_l0, ...) on a batch: (inputs,
    state) -> (output, next state); the output is the new hidden state."""

    def __init__(self, state: Mapping[str, np.ndarray], prefix: str, kind: str, inputs: int, size: int):
        gates = GATES[kind] * size
        self.kind, self.size = kind, size
        self.w_ih = tensor(state, f"{prefix}.weight_ih_l0", (gates, inputs)).T.copy()
        self.w_hh = tensor(state, f"{prefix}.weight_hh_l0", (gates, size)).T.copy()
        self.b_ih = tensor(state, f"{prefix}.bias_ih_l0", (gates,))
        self.b_hh = tensor(state, f"{prefix}.bias_hh_l0", (gates,))

    @property
    def state_size(self) -> int:
        return state_size(self.kind, self.size)

    def __call__(self, x: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.size
        if self.kind == "lstm":
            h, c = state[:, :n], state[:, n:]
            gates = x @ self.w_ih + self.b_ih + h @ self.w_hh + self.b_hh
            i, f, g, o = (gates[:, k * n : (k + 1) * n] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            return h, np.concatenate([h, c], axis=1).astype(np.float32, copy=False)
        h = state
        gi = x @ self.w_ih + self.b_ih
        gh = h @ self.w_hh + self.b_hh
        r = _sigmoid(gi[:, :n] + gh[:, :n])
        z = _sigmoid(gi[:, n : 2 * n] + gh[:, n : 2 * n])
        candidate = np.tanh(gi[:, 2 * n :] + r * gh[:, 2 * n :])
        h = ((1.0 - z) * candidate + z * h).astype(np.float32, copy=False)
        return h, h

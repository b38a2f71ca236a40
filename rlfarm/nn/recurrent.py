"""A recurrent core for a policy (PURE: torch): an LSTM or GRU after the encoder, stepped once per env
step when acting and over whole sequences when learning (truncated BPTT).

The state is one (batch, state_size) tensor: an LSTM's h and c side by side, a GRU's h, zeros at an
episode's start; rlfarm.nn.memory steps the same layer in numpy with the same layout. A sequence
starts from the state its task recorded for it (Rollout.states), and the state is zeroed before every
step that starts an episode (`starts`), as the actor zeroed it when it acted.

Learning runs torch's fused layer once per minibatch, not a Python loop over steps: each sequence is
cut where episodes start into fragments, which are padded to one length and run side by side (the
first from the sequence's recorded state, the others from zeros; padding comes after a fragment's
steps, so it changes none of them), then put back in place (benchmarks/recurrent_sb3.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlfarm.nn.memory import KINDS, state_size


class RecurrentCore(nn.Module):
    """A one-layer torch.nn.LSTM or GRU of `size` units on `inputs` features (its tensors:
    `rnn.weight_ih_l0`, `rnn.weight_hh_l0`, `rnn.bias_ih_l0`, `rnn.bias_hh_l0`, which rlfarm.nn.memory reads)."""

    def __init__(self, kind: str, inputs: int, size: int):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"a recurrent core is one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.size = kind, size
        self.rnn = nn.LSTM(inputs, size) if kind == "lstm" else nn.GRU(inputs, size)

    @property
    def state_size(self) -> int:
        return state_size(self.kind, self.size)

    def _run(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer over (L, B, inputs) from (B, state_size): outputs (L, B, size), last state."""
        if self.kind == "lstm":
            h, c = state[:, : self.size], state[:, self.size :]
            out, (h, c) = self.rnn(x, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
            return out, torch.cat([h[0], c[0]], dim=1)
        out, h = self.rnn(x, state.unsqueeze(0).contiguous())
        return out, h[0]

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on a batch: (output, next state); the output is the new hidden state."""
        out, state = self._run(x.unsqueeze(0), state)
        return out[0], state

    def sequence(self, x: torch.Tensor, starts: np.ndarray, state: torch.Tensor, burn_in: int = 0) -> torch.Tensor:
        """Outputs (L, B, size) of L steps of B sequences: `x` (L, B, inputs), `starts` (L, B) bool,
        numpy (an episode starts at that step: the state is zeroed before it), `state` (B,
        state_size) the state each sequence started from. `burn_in` (R2D2's, policy.burn_in): the
        first steps only refresh that state, recorded by an older version, with this network, and
        pass no gradient; their outputs come back detached."""
        if not burn_in:
            return self._fused(x, starts, state)
        with torch.no_grad():
            state, head = state.to(x.dtype), []
            for t in range(burn_in):
                state = _zeroed(state, starts[t]) if t else state
                out, state = self.step(x[t], state)
                head.append(out)
        rest = self._fused(x[burn_in:], starts[burn_in:], _zeroed(state, starts[burn_in]))
        return torch.cat([torch.stack(head), rest])

    def _fused(self, x: torch.Tensor, starts: np.ndarray, state: torch.Tensor) -> torch.Tensor:
        """`sequence` without burn-in: the fused layer once over the padded fragments (first row of
        `starts` not read: each sequence's first fragment starts from `state`)."""
        steps, batch = starts.shape
        fragment, position, first = fragments(starts)
        count, longest = int(fragment.max()) + 1, int(position.max()) + 1
        where = torch.from_numpy(position * count + fragment).to(x.device)  # (L x B,) in the padded (longest x count)
        padded = x.new_zeros(longest * count, x.shape[-1]).index_copy(0, where, x.reshape(steps * batch, -1))
        state = state.to(x.dtype)  # (recorded in float32; a network in float64 computes in float64)
        start = state.new_zeros(count, state.shape[1]).index_copy(0, torch.from_numpy(first).to(x.device), state)
        out, _ = self._run(padded.reshape(longest, count, -1), start)
        return out.reshape(longest * count, -1).index_select(0, where).reshape(steps, batch, -1)


def fragments(starts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of B sequences of L steps (`starts` (L, B) bool) cut where episodes start: each step's
    fragment number and its position in the fragment, (L, B) each, fragments numbered sequence by
    sequence; and (B,) each sequence's first fragment."""
    steps, batch = starts.shape
    cut = starts.copy()
    cut[0] = True  # every sequence opens a fragment
    per_sequence = cut.sum(0)
    first = np.cumsum(per_sequence) - per_sequence
    fragment = first[None, :] + np.cumsum(cut, axis=0) - 1
    t = np.arange(steps)[:, None]
    opened = np.maximum.accumulate(np.where(cut, t, 0), axis=0)
    return fragment.reshape(-1), (t - opened).reshape(-1), first


def _zeroed(state: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
    """`state` with the rows where an episode starts (`starts` (B,) bool) zeroed."""
    if not starts.any():
        return state
    return state * torch.from_numpy(~starts).to(device=state.device, dtype=state.dtype)[:, None]

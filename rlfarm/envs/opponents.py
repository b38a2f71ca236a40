"""Scripted players for the other seats of turn-based games (rlfarm.envs.turns), by name.

A player is `(obs, mask, rng) -> actions` on a batch of observations from its own seat (as the
learner would see them there) and the legal actions at each. The learner's past versions play
through the same signature (`actor_player`).

- "random": a uniformly random legal move: the baseline every game has.
- "lookahead": connect four's one-move lookahead: win if a move wins, else block the opponent's
  winning move, else random. It reads PettingZoo's `connect_four_v3` observation: (6, 7, 2), plane 0
  the mover's pieces, plane 1 the other's, row 0 the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlfarm.errors import EnvError

Opponent = Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]

RANDOM = "random"
LOOKAHEAD = "lookahead"
SCRIPTED = (RANDOM, LOOKAHEAD)


def random_legal(obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    counts = mask.sum(-1)
    pick = (rng.random(len(mask)) * counts).astype(np.int64)  # the pick-th legal action of each row
    return (mask.cumsum(-1) <= pick[:, None]).sum(-1)


def connect_four_lookahead(obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    boards = np.asarray(obs).reshape(len(obs), 6, 7, 2)
    actions = random_legal(obs, mask, rng)
    for i, board in enumerate(boards):
        mine, theirs = board[..., 0].astype(bool), board[..., 1].astype(bool)
        legal = np.flatnonzero(mask[i])
        win = [c for c in legal if _wins(mine, theirs, c)]
        block = [c for c in legal if _wins(theirs, mine, c)]
        if win:
            actions[i] = win[int(rng.integers(len(win)))]
        elif block:
            actions[i] = block[int(rng.integers(len(block)))]
    return actions


def _wins(player: np.ndarray, other: np.ndarray, column: int) -> bool:
    """Whether `player` dropping a piece in `column` connects four."""
    filled = player | other
    empty_rows = np.flatnonzero(~filled[:, column])
    if not len(empty_rows):
        return False
    row = int(empty_rows[-1])  # pieces fall to the lowest empty row (row 0 is the top)
    board = player.copy()
    board[row, column] = True
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < 6 and 0 <= c < 7 and board[r, c]:
                count += 1
                r, c = r + sign * dr, c + sign * dc
        if count >= 4:
            return True
    return False


def scripted(name: str, env_id: str) -> Opponent:
    """The scripted player `name` for `env_id`; an EnvError naming what exists otherwise."""
    if name == RANDOM:
        return random_legal
    if name == LOOKAHEAD:
        if "connect_four" not in env_id:
            raise EnvError(f"opponent {name!r} plays connect four only, not {env_id!r}; use {RANDOM!r}")
        return connect_four_lookahead
    raise EnvError(f"unknown opponent {name!r}: {', '.join(SCRIPTED)}, or versions of the run's policy")


def actor_player(actor: Any, deterministic: bool = False) -> Opponent:
    """A policy version (rlfarm.nn.actors.Actor) as a player: it samples among the legal moves
    (greedy with `deterministic`)."""

    def play(obs: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        spec = actor.spec
        batch = np.asarray(obs).reshape(len(obs), *spec.obs_shape).astype(spec.obs_dtype, copy=False)
        return actor.act(batch, rng, deterministic, mask=mask)[0]

    return play

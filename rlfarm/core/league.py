"""Self-play's league (PURE): the past versions a turn-based game's policy trains against, who plays
whom in each task, and the ratings the games give.

Each published version whose number is a multiple of `selfplay.league_every` joins the league; the
league keeps the newest `selfplay.league_size` of them (the trainer pins those in Redis so retention
never trims a version a task may still fetch). A task's games draw their opponents from a generator
seeded by the task's key, so a SYNC run draws the same opponents with any number of workers:
"self" (the version acting, a mirror match) with probability `latest_share`, else a league member
uniformly; `selfplay.scripted_share` of the games go to a scripted player instead (an exploiter's
curriculum). Scripted opponents (`selfplay.opponents` "random" or "lookahead") play every game instead.

Opponent names on the wire: "self", "v<N>" (version N of the run's policy), or a scripted player's
name (rlfarm.envs.opponents). A result reports, per opponent, the learner's wins, draws and losses
(return > 0, = 0, < 0). Elo ratings (Elo 1978; K = 16 per game): a version starts at its
predecessor's rating; "random" is the anchor at 0 and never moves; mirror matches rate nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

SELF = "self"
ANCHOR = "random"
ELO_K = 16.0


def version_name(version: int) -> str:
    return f"v{version}"


def named_version(name: str) -> int | None:
    """N for "v<N>", None for any other opponent name."""
    if name.startswith("v") and name[1:].isdigit():
        return int(name[1:])
    return None


def outcomes(games: Iterable[tuple[str, float]]) -> dict[str, list[int]]:
    """(opponent, the learner's return) of finished games as {opponent: [wins, draws, losses]}."""
    table: dict[str, list[int]] = {}
    for opponent, ret in games:
        row = table.setdefault(opponent, [0, 0, 0])
        row[0 if ret > 0 else 1 if ret == 0 else 2] += 1
    return table


@dataclass
class League:
    size: int = 8
    every: int = 5
    latest_share: float = 0.5
    scripted: str | None = None  # a scripted opponent for every game instead of the league
    exploiter: str | None = None  # a scripted opponent for `exploiter_share` of the games beside the league
    exploiter_share: float = 0.0
    members: list[int] = field(default_factory=list)  # versions, oldest first
    ratings: dict[str, float] = field(default_factory=lambda: {ANCHOR: 0.0})
    games: dict[str, list[int]] = field(default_factory=dict)  # the learner's record against each opponent

    def published(self, version: int) -> list[int]:
        """Version `version` was published: it joins when its number says so. Returns the versions
        that left the league (the trainer unpins them)."""
        if version_name(version) not in self.ratings:  # a version starts where its predecessor stands
            self.ratings[version_name(version)] = self.rating(version - 1)
        if self.scripted is not None or version % self.every or version in self.members:
            return []
        self.members.append(version)
        left, self.members = self.members[: -self.size], self.members[-self.size :]
        return left

    def rating(self, version: int) -> float:
        return self.ratings.get(version_name(version), 0.0)

    def draw(self, games: int, seed: Iterable[int]) -> list[str]:
        """The opponents of a task's `games` games, from a generator seeded by `seed` (run seed, task key)."""
        if self.scripted is not None:
            return [self.scripted] * games
        rng = np.random.default_rng(list(seed))
        scripted = rng.random(games) < self.exploiter_share if self.exploiter else np.zeros(games, bool)
        if not self.members:
            drawn = [SELF] * games
        else:
            mirror = rng.random(games) < self.latest_share
            picks = rng.integers(0, len(self.members), games)
            drawn = [SELF if m else version_name(self.members[p]) for m, p in zip(mirror, picks)]
        return [self.exploiter if s else d for s, d in zip(scripted, drawn)]

    def record(self, version: int, table: Mapping[str, list[int]]) -> None:
        """A result of `version`'s games: its record and the ratings move."""
        me = version_name(version)
        self.ratings.setdefault(me, self.rating(version - 1))
        for opponent, (wins, draws, losses) in table.items():
            row = self.games.setdefault(opponent, [0, 0, 0])
            row[0], row[1], row[2] = row[0] + wins, row[1] + draws, row[2] + losses
            if opponent == SELF:
                continue
            self.ratings.setdefault(opponent, 0.0)
            for score, count in ((1.0, wins), (0.5, draws), (0.0, losses)):
                for _ in range(count):
                    expected = 1.0 / (1.0 + 10 ** ((self.ratings[opponent] - self.ratings[me]) / 400.0))
                    delta = ELO_K * (score - expected)
                    self.ratings[me] += delta
                    if opponent != ANCHOR:
                        self.ratings[opponent] -= delta

    def win_rate(self, opponents: Iterable[str] | None = None) -> float | None:
        """Wins per game (draws half) over the record against `opponents` (default: all but mirror
        matches); None before any such game."""
        names = [o for o in (opponents if opponents is not None else self.games) if o != SELF]
        wins = draws = total = 0
        for name in names:
            w, d, lost = self.games.get(name, (0, 0, 0))
            wins, draws, total = wins + w, draws + d, total + w + d + lost
        return (wins + 0.5 * draws) / total if total else None

    def to_dict(self) -> dict:
        return {"members": list(self.members), "ratings": dict(self.ratings), "games": dict(self.games)}

    def restore(self, state: Mapping) -> None:
        self.members = [int(v) for v in state.get("members", [])]
        self.ratings = {str(k): float(v) for k, v in state.get("ratings", {ANCHOR: 0.0}).items()}
        self.games = {str(k): [int(x) for x in v] for k, v in state.get("games", {}).items()}

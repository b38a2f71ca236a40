"""The trainer's side of self-play (rlfarm.core.league): the opponents each task's games get, the
league's versions pinned in Redis while tasks may fetch them, the ratings its results give, and the
`selfplay/...` metrics."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rlfarm.core.league import ANCHOR, League
from rlfarm.errors import PolicyError

LEAGUE = "league"  # the league's hold on its members' versions (PolicyStore.pin)

if TYPE_CHECKING:
    from rlfarm.config import RunConfig
    from rlfarm.core.protocol import Result
    from rlfarm.farm.policies.store import PolicyStore


class SelfPlay:
    def __init__(self, config: RunConfig, store: PolicyStore):
        sp = config.selfplay
        self.seed = config.seed
        self.games = config.env.num_envs
        self.store = store
        self.league = League(
            sp.league_size,
            sp.league_every,
            sp.latest_share,
            None if sp.opponents == "league" else sp.opponents,
            exploiter=sp.scripted if sp.scripted_share > 0 else None,
            exploiter_share=sp.scripted_share,
        )
        self.newest = 0

    def opponents(self, act: dict[str, Any], iteration: int, index: int) -> dict[str, Any]:
        """A task's `act` with its games' opponents, drawn from (run seed, iteration, index)."""
        return {**act, "opponents": self.league.draw(self.games, (self.seed, iteration, index))}

    def published(self, version: int) -> None:
        """A version was published: a league member is pinned (retention never trims a version a task
        may fetch), one that left the league unpinned."""
        self.newest = version
        before = set(self.league.members)
        for gone in self.league.published(version):
            self.store.unpin(gone, LEAGUE)
        for joined in set(self.league.members) - before:
            self.store.pin(joined, LEAGUE)

    def record(self, message: Result) -> None:
        if message.games and message.version is not None:
            self.league.record(message.version, message.games)

    def scalars(self) -> dict[str, float]:
        """The same keys at every log step (progress.csv's columns are its first row's); NaN until known."""
        league = self.league
        rate = league.win_rate()  # against the league and scripted players, draws half
        against_random = league.win_rate([ANCHOR])
        against_lookahead = league.win_rate(["lookahead"])
        return {
            "selfplay/elo": league.rating(self.newest),
            "selfplay/league_size": float(len(league.members)),
            "selfplay/win_rate": math.nan if rate is None else rate,
            "selfplay/win_rate_random": math.nan if against_random is None else against_random,
            "selfplay/win_rate_lookahead": math.nan if against_lookahead is None else against_lookahead,
        }

    def state(self) -> dict[str, Any]:
        return {"league": self.league.to_dict(), "newest": self.newest}

    def restore(self, state: dict[str, Any] | None) -> None:
        """A resumed run's league (its versions are pinned again by `pin_league`, once the dead
        trainer's pins are forgotten)."""
        if state:
            self.league.restore(state["league"])
            self.newest = int(state.get("newest", 0))

    def pin_league(self) -> list[int]:
        """Pin the league's members; returns those dropped because this Redis no longer holds them (a
        run resumed on another Redis, or one that lost its data): tasks could not fetch them, and the
        league refills as versions are published."""
        dropped = []
        for version in list(self.league.members):
            try:
                self.store.pin(version, LEAGUE)
            except PolicyError:
                self.league.members.remove(version)
                self.store.unpin(version, LEAGUE)
                dropped.append(version)
        return dropped

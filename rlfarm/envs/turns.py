"""Turn-based games (PettingZoo AEC envs whose players take turns: chess, go, connect four) as vector
envs of games, each seen from the learner's seat.

Every sub-env is one game. The learner plays one seat of it; the other seats are played by
opponents inside the env's step: the learner's move, then each opponent's until it is the learner's
turn again or the game is over. So a rollout, a result and every learner see a game as a
single-agent episode: an observation at each of the learner's turns, its reward the sum of what it
got from its own move and the replies (a loss on the opponent's move is the learner's last move's
reward), and no steps at which the learner does not act. The seat alternates from game to game
(game g's e-th episode since the reset that seeded it with s: seat (s + e) mod K), so a policy learns
to play first and second alike, and an evaluation's episodes, seeded seed + i, alternate seats.

Opponents: a callable `(obs, mask, rng) -> actions` on a batch of observations from the opponent's
seat, as the learner would see them. The worker sets them per task (`set_opponents`): past
versions of the run's policy (self-play, rlfarm.core.league) or scripted players
(rlfarm.envs.opponents); without that, uniformly random legal moves. The opponents of all games
that wait for one are asked in one batch per opponent. `finished` lists (opponent, the learner's
return) of each game that ended, which the worker reports with the result.

Action masks: an observation that is a dict with "observation" and "action_mask" (PettingZoo's
classic games) is split: the learner observes the first, and `info["action_mask"]` (N, A) bool
says what is legal at the observation returned (SpaceSpec.action_mask).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlfarm.envs import plain
from rlfarm.envs.opponents import RANDOM, Opponent, random_legal
from rlfarm.errors import EnvError

ONE_POLICY = "one policy plays every seat, so they must be the same"
MAX_REPLIES = 10_000  # opponent moves in a row before the game is called broken (a game that never hands back)


def is_turn_based(env: Any) -> bool:
    """An AEC env that PettingZoo cannot run as a Parallel env: its players take turns."""
    return hasattr(env, "agent_iter") and not env.metadata.get("is_parallelizable", False)


class TurnVector(VectorEnv):
    """`games` copies of a turn-based AEC env, each a sub-env seen from the learner's seat (see the module)."""

    def __init__(self, make: Callable[[], Any], games: int, env_id: str = "", first: Any = None) -> None:
        self.env_id = env_id
        self._make = make
        self.games = [first if first is not None and g == 0 else make() for g in range(games)]
        first = self.games[0]
        self.agents: list[str] = list(first.possible_agents)
        self.k = len(self.agents)
        self.num_envs = games
        obs_space = one_space(first, "observation_space", self.agents, env_id, ONE_POLICY)
        self.masked = isinstance(obs_space, gym.spaces.Dict) and "action_mask" in obs_space.spaces
        self.single_observation_space = obs_space["observation"] if self.masked else obs_space
        self.single_action_space = one_space(first, "action_space", self.agents, env_id, ONE_POLICY)
        if self.masked and not isinstance(self.single_action_space, gym.spaces.Discrete):
            raise EnvError(f"env {env_id!r}: action masks need a Discrete action space, not {self.single_action_space}")
        self.observation_space = batch_space(self.single_observation_space, games)
        self.action_space = batch_space(self.single_action_space, games)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = getattr(first, "render_mode", None)
        self.spec = None
        n_actions = int(getattr(self.single_action_space, "n", 0))
        self._obs = np.zeros((games, *self.single_observation_space.shape), self.single_observation_space.dtype)
        self._mask = np.ones((games, max(n_actions, 1)), bool)
        self._seat = np.zeros(games, np.int64)  # the learner's seat in each game
        self._first_seat = np.zeros(games, np.int64)  # its seat in the first game after a reset
        self._episodes = np.zeros(games, np.int64)  # games played per sub-env since the last reset
        self._reward = np.zeros(games, np.float64)  # the learner's reward since its last move
        self._rng = np.random.default_rng(0)
        self.opponent_of: list[str] = [RANDOM] * games  # each game's opponent, by name
        self.players: dict[str, Opponent] = {RANDOM: random_legal}
        self.finished: list[tuple[str, float]] = []  # (opponent, the learner's return) of each game ended
        self._return = np.zeros(games, np.float64)

    def grown_to(self, games: int) -> TurnVector:
        return TurnVector(self._make, games, self.env_id, first=self.games[0])

    def set_opponents(self, opponent_of: Sequence[str], players: dict[str, Opponent]) -> None:
        """Who plays the other seats: `opponent_of[g]` names game g's opponent in `players` (from the
        next move on; a task sets them before its first reset)."""
        if len(opponent_of) != self.num_envs:
            raise ValueError(f"{len(opponent_of)} opponents for {self.num_envs} games")
        missing = sorted(set(opponent_of) - set(players))
        if missing:
            raise ValueError(f"no player for opponent(s) {missing}")
        self.opponent_of, self.players = list(opponent_of), dict(players)

    # ---- the vector API -------------------------------------------------------------------------
    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None):
        """`seed`: one per game, or one for all (game g: seed + g); the opponents' sampling is seeded
        from the first."""
        seeds = _seeds(seed, self.num_envs)
        self._rng = np.random.default_rng(seeds[0])
        self._episodes[:] = 0
        self.finished = []
        for g, s in enumerate(seeds):
            self._first_seat[g] = (s or 0) % self.k
            self._start(g, s)
        self._replies()
        return self._obs.copy(), self._info()

    def step(self, actions: Any):
        actions = np.asarray(actions)
        n = self.num_envs
        self._reward[:] = 0.0
        for g, game in enumerate(self.games):
            self._move(g, game, actions[g])
        self._replies()
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        final_obs = np.full(n, None, dtype=object)
        final_mask = np.ones_like(self._mask)
        rewards = self._reward.copy()
        restarted = []
        for g, game in enumerate(self.games):
            me = self.agents[self._seat[g]]
            if game.terminations.get(me, True) or game.truncations.get(me, True) or not game.agents:
                terminated[g] = bool(game.terminations.get(me, not game.truncations.get(me, False)))
                truncated[g] = not terminated[g]
                final_obs[g], final_mask[g] = self._observe(game, me)
                self.finished.append((self.opponent_of[g], float(self._return[g])))
                self._episodes[g] += 1
                self._start(g, None)
                restarted.append(g)
        self._replies(restarted)  # the new games, where an opponent may move first
        info = self._info()
        ended = terminated | truncated
        if ended.any():
            final_info = {"action_mask": final_mask, "_action_mask": ended} if self.masked else {}
            info.update({"final_obs": final_obs, "_final_obs": ended, "final_info": final_info, "_final_info": ended})
        return self._obs.copy(), rewards, terminated, truncated, info

    # ---- "continue" episodes (rlfarm.envs.snapshot) ----------------------------------------------
    _ARRAYS = ("obs", "mask", "seat", "first_seat", "episodes", "reward", "return")

    def snapshot(self) -> dict[str, Any]:
        """The vector's complete state: its own arrays, the opponents' random generator and each game's
        PettingZoo objects (the board, whose turn, the agents' rewards and dones). Not the opponents:
        a task names its own (`set_opponents`), and a game that goes on into the next task is played
        on by the opponent that task names for it (docs/multiagent.md)."""
        return {
            **{name: getattr(self, f"_{name}").copy() for name in self._ARRAYS},
            "rng": plain.plain(self._rng),
            "games": [plain.capture_object(game) for game in self.games],
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Put a vector made like the one `snapshot` saved into its state."""
        if len(saved["games"]) != len(self.games) or np.shape(saved["obs"]) != self._obs.shape:
            raise ValueError(f"env snapshot of {len(saved['games'])} games, not {len(self.games)}")
        for name in self._ARRAYS:
            np.copyto(getattr(self, f"_{name}"), saved[name])
        self._rng = plain.unplain(saved["rng"], self._rng)
        for game, game_state in zip(self.games, saved["games"]):
            # A game made but never reset lacks the objects a reset makes (the turn's agent selector);
            # reset, they exist to be written into.
            game.reset(seed=0)
            plain.restore_object(game, game_state)

    def render(self) -> Any:
        """The first game's frame (what `rlfarm eval --video` records: it plays one game)."""
        return self.games[0].render()

    def close(self, **kwargs: Any) -> None:
        for game in self.games:
            game.close()

    # ---- one game -------------------------------------------------------------------------------
    def _start(self, g: int, seed: int | None) -> None:
        game = self.games[g]
        game.reset(seed=seed)
        self._seat[g] = (self._first_seat[g] + self._episodes[g]) % self.k
        self._return[g] = 0.0
        for agent in self.agents:
            if agent not in game.agents:
                raise EnvError(
                    f"env {self.env_id!r}: agent {agent} is not in the game at its start; "
                    f"agents that join a game late are not supported"
                )

    def _move(self, g: int, game: Any, action: Any) -> None:
        """Play the learner's move in game g and count what it got."""
        me = self.agents[self._seat[g]]
        if game.agent_selection != me or not game.agents:
            raise EnvError(f"env {self.env_id!r}: game {g} is not at the learner's turn")
        game.step(action)
        self._count(g, game, me)

    def _count(self, g: int, game: Any, me: str) -> None:
        got = float(game.rewards.get(me, 0.0))
        self._reward[g] += got
        self._return[g] += got

    def _replies(self, games: Sequence[int] | None = None) -> None:
        """Games `games` (default: all) not at the learner's turn: their opponents move (dead agents
        are stepped out as the AEC API asks), batched by opponent, until each game is at the
        learner's turn or over; then the learner's view of each is observed once."""
        games = range(self.num_envs) if games is None else games
        for _ in range(MAX_REPLIES):
            waiting: dict[str, list[int]] = {}
            for g in games:
                game = self.games[g]
                me = self.agents[self._seat[g]]
                while game.agents and game.agent_selection != me and _done(game, game.agent_selection):
                    game.step(None)  # an agent out of the game is stepped with None (the AEC API)
                if not game.agents or _done(game, me):
                    continue
                if game.agent_selection != me:
                    waiting.setdefault(self.opponent_of[g], []).append(g)
            if not waiting:
                break
            for name, moving in waiting.items():
                views = [self._observe(self.games[g], self.games[g].agent_selection) for g in moving]
                obs = np.stack([v[0] for v in views])
                mask = np.stack([v[1] for v in views])
                actions = self.players[name](obs, mask, self._rng)
                for g, action in zip(moving, np.asarray(actions)):
                    game = self.games[g]
                    game.step(int(action) if self.masked else action)
                    self._count(g, game, self.agents[self._seat[g]])
        else:
            raise EnvError(f"env {self.env_id!r}: the opponents moved {MAX_REPLIES} times without the learner's turn")
        for g in games:
            game, me = self.games[g], self.agents[self._seat[g]]
            if game.agents and not _done(game, me):
                self._obs[g], self._mask[g] = self._observe(game, me)

    def _observe(self, game: Any, agent: str) -> tuple[np.ndarray, np.ndarray]:
        obs = game.observe(agent)
        if self.masked:
            return np.asarray(obs["observation"]), np.asarray(obs["action_mask"], bool)
        return np.asarray(obs), np.ones(self._mask.shape[1], bool)

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self._mask.copy()} if self.masked else {}


def _done(game: Any, agent: str) -> bool:
    return bool(game.terminations.get(agent, False) or game.truncations.get(agent, False))


def _seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    if isinstance(seed, int):
        return [seed + g for g in range(n)]
    if seed is None:
        return [None] * n
    return [int(s) for s in seed]


def one_space(env: Any, which: str, agents: list[str], env_id: str, why: str) -> gym.Space:
    """The one `which` ("observation_space", "action_space") the `agents` of a PettingZoo env share; an
    EnvError naming two that differ, and `why` they must not."""
    spaces = {agent: getattr(env, which)(agent) for agent in agents}
    first = spaces[agents[0]]
    others = [a for a in agents[1:] if spaces[a] != first]
    if others:
        raise EnvError(
            f"env {env_id!r}: agents {agents[0]} and {others[0]} have different {which.replace('_', ' ')}s "
            f"({first} and {spaces[others[0]]}); {why}"
        )
    return first

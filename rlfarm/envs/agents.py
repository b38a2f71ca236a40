"""Multi-agent envs (PettingZoo's Parallel API) as vector envs whose sub-envs are agents.

A game of K agents fills K sub-envs, one per agent of its `possible_agents`, in that order: a vector
of `num_envs` sub-envs holds num_envs / K games, sub-env g * K + k being agent k of game g. One
policy acts for every agent (parameter sharing, as SuperSuit's vector env of agents does for SB3),
so a rollout, a result, the replay and the learner see agents as they see the sub-envs of a
single-agent env, and env steps count agent steps, as there. Agents share one observation and one
action space; the per-agent rewards, terminations and truncations are the sub-envs'. A game ends
when its last agent is done and is then reset in the same step (SAME_STEP autoreset, like
rlfarm.envs.make's vectors): each agent's final observation is in info["final_obs"] at the step it
is done. An agent done before the others is out of its game until the game ends: its sub-env takes
no action, gets no reward and no episode end, and info["active"] says so, so that collect marks
those steps (Rollout.active) and no learner learns from them. An agent whose info says "acting":
False (an upper level between decisions) sits out its next step the same way, but stays in its game
and keeps its rewards, which flow back to the decision before (its learner's returns).

An agent that is not in its game yet (absent from the observations of the reset, PettingZoo's
`agents` growing later) sits out the same way until its first observation comes: info["active"]
says so from the reset on, and an evaluation's game ends when the game does ("game_ended").

Action masks (PettingZoo's convention): agents whose observation space is a Dict of "observation"
and "action_mask" observe the first, and info["action_mask"] (N, A) bool says what each may do at the
observation returned (SpaceSpec.action_mask), as rlfarm.envs.turns does for turn-based games; an agent
out of its game may do anything (it acts for nothing).

Turn-based games (AEC envs whose players take turns) are rlfarm.envs.turns's.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlfarm.envs import plain
from rlfarm.envs.turns import is_turn_based, one_space
from rlfarm.errors import EnvError

# PettingZoo's env families by id prefix: "mpe2/simple_spread_v3" is mpe2.simple_spread_v3,
# "pettingzoo/classic/connect_four_v3" is pettingzoo.classic.connect_four_v3. A fixed list of packages,
# so workers build these ids without RLFARM_ALLOWED_ENV_MODULES, as they build gymnasium's registered ids.
FAMILIES = {
    "mpe2/": "mpe2",
    "pettingzoo/classic/": "pettingzoo.classic",
    "pettingzoo/butterfly/": "pettingzoo.butterfly",
    "pettingzoo/sisl/": "pettingzoo.sisl",
    "rlfarm/": "rlfarm.envs.shipped",  # the envs rlfarm ships (four rooms)
}
# Why agents must share a space: one policy acts for them (env.policy_map gives agents of different
# observation spaces policies of their own; every policy takes the same actions).
SHARED = (
    "one policy acts for them, so they must be the same (env.policy_map gives agents of different "
    "observation spaces policies of their own)"
)
SAME_ACTIONS = "every agent must take the same actions, whichever policy acts for it"
_EXTRA = {"mpe2": "multiagent", "pettingzoo.classic": "multiagent"}


def pettingzoo_module(env_id: str) -> str | None:
    """The module a PettingZoo env id names ("mpe2/simple_spread_v3" -> "mpe2.simple_spread_v3"),
    None for any other id. The name must be one identifier: nothing else is ever imported."""
    for prefix, package in FAMILIES.items():
        if env_id.startswith(prefix):
            name = env_id[len(prefix) :]
            return f"{package}.{name}" if name.isidentifier() else None
    return None


def pettingzoo_factory(env_id: str) -> Callable[..., Any] | None:
    """A constructor of the Parallel env a PettingZoo id names (`parallel_env`, else the AEC `env`
    converted), or None for another id."""
    module_name = pettingzoo_module(env_id)
    if module_name is None:
        return None
    import importlib

    package = module_name.rsplit(".", 1)[0]
    try:
        importlib.import_module(package)
    except ImportError as exc:
        extra = _EXTRA.get(package, "multiagent")
        raise EnvError(
            f'env {env_id!r} needs {package.split(".")[0]}, which is not installed ({exc}): pip install -e ".[{extra}]"'
        ) from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise EnvError(f"env {env_id!r}: cannot import {module_name}: {exc}") from None
        raise EnvError(f"unknown env {env_id!r}: {package} has no env {module_name.rsplit('.', 1)[1]!r}") from None
    make = getattr(module, "parallel_env", None) or getattr(module, "env", None)
    if make is None:
        raise EnvError(f"env {env_id!r}: {module_name} has no parallel_env or env constructor")
    return lambda **kwargs: to_parallel(make(**kwargs), env_id)


def is_multiagent(env: Any) -> bool:
    """A PettingZoo Parallel env (or anything shaped like one): agents, and spaces per agent."""
    return hasattr(env, "possible_agents") and callable(getattr(env, "observation_space", None))


def to_parallel(env: Any, env_id: str) -> Any:
    """A PettingZoo env in its Parallel form: AEC envs through PettingZoo's own conversion, which only
    takes games whose agents all act at every step. A turn-based game stays an AEC env
    (rlfarm.envs.turns plays it)."""
    if hasattr(env, "agent_iter"):  # an AEC env
        from pettingzoo.utils.conversions import aec_to_parallel

        if is_turn_based(env):
            return env
        try:
            return aec_to_parallel(env)
        except AssertionError as exc:
            raise EnvError(f"env {env_id!r}: PettingZoo cannot run it as a Parallel env ({exc})") from None
    return env


class AgentVector(VectorEnv):
    """`games` copies of a Parallel env, their agents side by side as sub-envs (see the module)."""

    def __init__(
        self,
        make: Callable[[], Any],
        games: int,
        env_id: str = "",
        first: Any = None,
        policy_map: Sequence[str] = (),
    ) -> None:
        """`policy_map` (env.policy_map): "pattern=policy" entries (fnmatch patterns of agent ids, the
        first that matches wins) when several policies act; agents of different observation spaces
        then have their observations flattened and zero-padded to the largest."""
        self.env_id = env_id
        self._make = make
        self.games = [first if first is not None and g == 0 else make() for g in range(games)]
        first = self.games[0]
        self.agents: list[str] = list(first.possible_agents)
        self.k = len(self.agents)
        self.num_envs = games * self.k
        self.policy_map = tuple(policy_map)
        self.policy_of: tuple[str, ...] = ()  # each agent's policy, with a map
        self.policy_names: tuple[str, ...] = ()
        self.agent_obs_dims: tuple[int, ...] = ()
        self.single_action_space = one_space(first, "action_space", self.agents, env_id, SAME_ACTIONS)
        self.masked = all(_mask_dict(first.observation_space(agent)) for agent in self.agents)
        if self.masked and not isinstance(self.single_action_space, gym.spaces.Discrete):
            raise EnvError(f"env {env_id!r}: action masks need Discrete actions, not {self.single_action_space}")
        if self.policy_map:
            self.policy_of, self.policy_names = map_agents(self.policy_map, self.agents, env_id)
            self.single_observation_space = self._padded_space(first)
        else:
            self.single_observation_space = self._inner(
                one_space(first, "observation_space", self.agents, env_id, SHARED)
            )
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.render_mode = getattr(first, "render_mode", None)
        self.spec = None
        self._obs = np.zeros((self.num_envs, *self.single_observation_space.shape), self.single_observation_space.dtype)
        self._in_game = np.ones(self.num_envs, bool)  # the sub-env's agent is in its game now
        # The agent's next action is ignored (its info said "acting": False: an upper level between
        # its decisions, rlfarm.envs.shipped.four_rooms_two_level): a step it sits out, but in its game.
        self._waiting = np.zeros(self.num_envs, bool)
        # Masked envs: what each sub-env's agent may do at its observation (all, while out of its game).
        self._mask = np.ones((self.num_envs, self.single_action_space.n), bool) if self.masked else None

    def _inner(self, space: gym.Space) -> gym.Space:
        """What an agent observes, without its action mask."""
        return space.spaces["observation"] if self.masked else space

    def _padded_space(self, first: Any) -> gym.Space:
        """One Box wide enough for every agent's flattened observation; a policy's agents must share
        their space."""
        spaces = {agent: self._inner(first.observation_space(agent)) for agent in self.agents}
        for name in self.policy_names:
            mine = [a for a, p in zip(self.agents, self.policy_of) if p == name]
            one_space(first, "observation_space", mine, self.env_id, SHARED)
        for agent, space in spaces.items():
            if not isinstance(space, gym.spaces.Box):
                raise EnvError(f"env {self.env_id!r}: agent {agent}'s observation space {space} is not a Box")
        self.agent_obs_dims = tuple(int(np.prod(spaces[a].shape)) for a in self.agents)
        return gym.spaces.Box(-np.inf, np.inf, (max(self.agent_obs_dims),), np.float32)

    def grown_to(self, games: int) -> AgentVector:
        """This vector's first game and `games - 1` more, as one vector."""
        return AgentVector(self._make, games, self.env_id, first=self.games[0], policy_map=self.policy_map)

    def _put(self, i: int, obs: Any) -> None:
        """Sub-env i's observation, flattened and zero-padded where agents' spaces differ."""
        if self._mask is not None:
            self._mask[i] = np.asarray(obs["action_mask"], bool).reshape(-1)
            obs = obs["observation"]
        if self.agent_obs_dims:
            flat = np.asarray(obs, np.float32).reshape(-1)
            self._obs[i, : len(flat)] = flat
            self._obs[i, len(flat) :] = 0.0
        else:
            self._obs[i] = obs

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None):
        """`seed`: one per sub-env (game g takes the one of its first agent) or one for all."""
        if isinstance(seed, int):
            seeds: list[int | None] = [seed + g for g in range(len(self.games))]
        elif seed is None:
            seeds = [None] * len(self.games)
        else:
            seeds = [seed[g * self.k] for g in range(len(self.games))]
        for g, s in enumerate(seeds):
            self._reset_game(g, s, options)
        return self._obs.copy(), self._info({})

    def _reset_game(self, g: int, seed: int | None, options: dict[str, Any] | None = None) -> None:
        obs, _ = self.games[g].reset(seed=seed, options=options)
        if not obs:
            raise EnvError(f"env {self.env_id!r}: no agent is in the game at its start")
        for k, agent in enumerate(self.agents):
            i = g * self.k + k
            self._in_game[i] = agent in obs  # an agent not there yet joins at its first observation
            self._waiting[i] = False
            if agent in obs:
                self._put(i, obs[agent])
            else:
                self._obs[i] = 0
                if self._mask is not None:
                    self._mask[i] = True

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        """The flags every step's (and the reset's) info carries: which agents act next, their masks."""
        acting = self._in_game & ~self._waiting
        if not acting.all():  # which sub-envs' agents act at the next step (rlfarm.core.rollout)
            info["active"] = acting
        if self._mask is not None:
            info["action_mask"] = self._mask.copy()
        return info

    def step(self, actions: Any):
        actions = np.asarray(actions)
        n = self.num_envs
        rewards = np.zeros(n, np.float64)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        final_obs = np.full(n, None, dtype=object)
        final_masks = np.ones((n, self._mask.shape[1]), bool) if self._mask is not None else None
        ended = np.zeros(n, bool)
        game_ended = np.zeros(n, bool)
        for g, game in enumerate(self.games):
            base = g * self.k
            playing = [(k, agent) for k, agent in enumerate(self.agents) if self._in_game[base + k]]
            obs, rew, term, trunc, infos = game.step({agent: actions[base + k] for k, agent in playing})
            for k, agent in enumerate(self.agents):  # agents joining the game now: in from here on
                if not self._in_game[base + k] and agent in obs and agent in game.agents:
                    self._in_game[base + k] = True
                    self._put(base + k, obs[agent])
            for k, agent in playing:
                i = base + k
                self._waiting[i] = (infos or {}).get(agent, {}).get("acting", True) is False
                rewards[i] = rew.get(agent, 0.0)
                terminated[i] = bool(term.get(agent, False))
                truncated[i] = bool(trunc.get(agent, False))
                if agent in obs:
                    self._put(i, obs[agent])
                if terminated[i] or truncated[i]:
                    final_obs[i] = self._obs[i].copy()
                    if final_masks is not None:
                        final_masks[i] = self._mask[i]
                        self._mask[i] = True
                    ended[i] = True
                    self._in_game[i] = False  # out until its game ends: it acts no more
            if not game.agents or not self._in_game[base : base + self.k].any():
                game_ended[base : base + self.k] = True
                self._reset_game(g, None)
        info: dict[str, Any] = {}
        if ended.any():
            final_info = {"action_mask": final_masks, "_action_mask": ended} if final_masks is not None else {}
            info = {"final_obs": final_obs, "_final_obs": ended, "final_info": final_info, "_final_info": ended}
        if game_ended.any():  # games that ended at this step and were reset (evaluations end there)
            info["game_ended"] = game_ended
        return self._obs.copy(), rewards, terminated, truncated, self._info(info)

    def snapshot(self) -> dict[str, Any]:
        """The vector's complete state (rlfarm.envs.snapshot, "continue" episodes): its own arrays and
        each game's objects."""
        return {
            "obs": self._obs.copy(),
            "in_game": self._in_game.copy(),
            "waiting": self._waiting.copy(),
            "mask": None if self._mask is None else self._mask.copy(),
            "games": [plain.capture_object(game) for game in self.games],
        }

    def restore(self, saved: dict[str, Any]) -> None:
        """Put a vector made like the one `snapshot` saved into its state."""
        if len(saved["games"]) != len(self.games) or np.shape(saved["obs"]) != self._obs.shape:
            raise ValueError(f"env snapshot of {len(saved['games'])} games, not {len(self.games)}")
        for name in ("obs", "in_game", "waiting", "mask"):
            if getattr(self, f"_{name}") is not None:
                np.copyto(getattr(self, f"_{name}"), saved[name])
        for game, game_state in zip(self.games, saved["games"]):
            plain.restore_object(game, game_state)

    def render(self) -> Any:
        """The first game's frame (what `rlfarm eval --video` records: it plays one game)."""
        return self.games[0].render()

    def close(self, **kwargs: Any) -> None:
        for game in self.games:
            game.close()


def _mask_dict(space: gym.Space) -> bool:
    """PettingZoo's masked observation: a Dict of "observation" and "action_mask"."""
    return isinstance(space, gym.spaces.Dict) and set(space.spaces) == {"observation", "action_mask"}


def parse_policy_map(entries: Sequence[str]) -> list[tuple[str, str]]:
    """env.policy_map's "pattern=policy" entries as (pattern, policy) pairs; ValueError on a bad one."""
    pairs = []
    for entry in entries:
        pattern, sep, policy = str(entry).partition("=")
        if not sep or not pattern.strip() or not policy.strip().isidentifier():
            raise ValueError(
                f"env.policy_map entry {entry!r} is not 'pattern=policy' (an agent id pattern such as "
                f"'adversary_*', and a policy name that is an identifier)"
            )
        pairs.append((pattern.strip(), policy.strip()))
    return pairs


def map_agents(entries: Sequence[str], agents: Sequence[str], env_id: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Each agent's policy (the first pattern that matches its id) and the policies' names in the map's
    order; an EnvError names an agent no pattern matches."""
    try:
        pairs = parse_policy_map(entries)
    except ValueError as exc:
        raise EnvError(str(exc)) from None
    policy_of = []
    for agent in agents:
        match = next((policy for pattern, policy in pairs if fnmatch.fnmatchcase(agent, pattern)), None)
        if match is None:
            raise EnvError(
                f"env {env_id!r}: no env.policy_map entry matches agent {agent!r} (its agents: {', '.join(agents)})"
            )
        policy_of.append(match)
    names = tuple(dict.fromkeys(policy for _, policy in pairs if policy in policy_of))
    return tuple(policy_of), names

"""Collecting experience: PURE (no Redis, no Celery). A rollout task is `collect` plus transport.

Two ways a task meets its episodes (`farm.episodes`):
- "fresh": episodes start fresh in every task, seeded from (run seed, iteration, task index): the
  same task run twice, on any worker, gives the same arrays. Episodes still running when the task
  ends are cut and bootstrapped from the value of the last observation; they are never reported.
- "continue": a run's env streams (rlfarm.core.streams) go on across tasks; a task takes the next
  steps of the stream it names, and an episode spanning many tasks is reported, with its whole return
  and length, by the task in which it ends. A stream's state travels as a snapshot between tasks, so
  this is as reproducible as "fresh": the same on any process, or any number of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from rlfarm.core.streams import EnvStream
    from rlfarm.envs import SpaceSpec
    from rlfarm.nn.acting import Actor


@dataclass
class Rollout:
    """Arrays shaped (T, N, ...) for T steps of N sub-envs. Observations keep the spec's shape and
    dtype (T, N, *obs_shape), uint8 or float32; discrete actions are int64 (T, N), Box actions
    float32 (T, N, action_dim)."""

    obs: np.ndarray  # observation the action was chosen on
    actions: np.ndarray  # as sampled (Box actions are clipped only when sent to the env)
    logprobs: np.ndarray
    values: np.ndarray  # V(obs)
    rewards: np.ndarray
    dones: np.ndarray  # the episode ended at this step (terminated or truncated)
    final_values: np.ndarray  # V(real final obs) where truncated, 0 where terminated or not done
    last_values: np.ndarray  # (N,) V(obs after the last step), to bootstrap the cut episodes
    episode_returns: np.ndarray  # episodes that finished inside this task
    episode_lengths: np.ndarray
    # Off-policy only (collect(keep_next_obs=True)): the real next observation of every step (the
    # final one where an episode ended) and which ends were terminations rather than truncations.
    next_obs: np.ndarray | None = None
    terminations: np.ndarray | None = None
    # (N, *obs_shape) the observation after the last step: a learner acting on lagged data (APPO)
    # recomputes the bootstrap value of the cut episodes with its own critic.
    last_obs: np.ndarray | None = None
    # Multi-agent envs whose agents leave a game early (rlfarm.envs.agents): (T, N) whether the
    # sub-env's agent was in its game and acted at that step; None when every one always did. A step
    # it did not act at is learned from by no learner. An agent out of its game gets no reward there;
    # an upper level between its decisions does, and its returns carry it back to the decision.
    active: np.ndarray | None = None
    # Envs with action masks (SpaceSpec.action_mask: turn-based games, rlfarm.envs.turns): (T, N, A)
    # bool, the actions legal at `obs` (the actor chose among them); with keep_next_obs also the
    # ones legal at `next_obs` (a Q-learner's target maximises over them). None for other envs.
    action_masks: np.ndarray | None = None
    next_action_masks: np.ndarray | None = None
    # Several policies (SpaceSpec.policies): the sub-env each episode of `episode_returns` ended in,
    # so each policy's learner and metrics see its own agents' episodes. None otherwise.
    episode_columns: np.ndarray | None = None
    # A recurrent actor's (K, N, S) state at the start of each of the task's K learning sequences
    # (Actor.seq_len steps each; zeros where an episode starts there): the learner replays each
    # sequence from it and needs nothing of the worker's memory. None for feed-forward actors.
    states: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.rewards.size)

    def to_dict(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


def task_seeds(run_seed: int, iteration: int, index: int, num_envs: int) -> tuple[list[int], int]:
    """Env reset seeds and the action-sampling seed of one task; independent streams per task."""
    ss = np.random.SeedSequence([run_seed, iteration, index])
    env_ss, act_ss = ss.spawn(2)
    env_seeds = [int(s) for s in env_ss.generate_state(num_envs, dtype=np.uint32)]
    return env_seeds, int(act_ss.generate_state(1, dtype=np.uint32)[0])


def as_obs(spec: SpaceSpec, obs: Any, n: int) -> np.ndarray:
    """A batch of n observations as the spec keeps them: its shape, uint8 or float32 (float64 envs
    are cast here, once)."""
    return np.asarray(obs).reshape(n, *spec.obs_shape).astype(spec.obs_dtype, copy=False)


def collect(
    policy: Actor,
    envs: VectorEnv,
    n_steps: int,
    env_seeds: list[int],
    action_seed: int,
    deterministic: bool = False,
    keep_next_obs: bool = False,
    stream: EnvStream | None = None,
    refresh: Callable[[], Actor | None] | None = None,
    refresh_steps: int = 0,
) -> Rollout:
    """Step `envs` (SAME_STEP autoreset, see envs.make_vector_env) for n_steps with `policy`.
    `keep_next_obs`: also keep every step's real next observation (off-policy learners).
    `stream` ("continue"): go on from where the stream's last task left its envs (`envs` and
    `env_seeds` are then the stream's), and leave it where this task ends.
    `refresh` (ASYNC): called every `refresh_steps` steps; a policy it returns acts from then on (a
    newer version, as IMPALA's actors pick up new weights mid-rollout). Every step's log-probability
    and value are those of the policy that acted, so the learner's correction sees the truth."""
    if stream is not None:
        envs = stream.envs
    n = envs.num_envs
    states_buf = None
    recurrent = getattr(policy, "recurrent", False)  # (an actor is any object with act and value)
    if recurrent:  # its state: where the stream left it, or zeros for new episodes
        policy.begin(n, stream.policy_state if stream is not None and stream.obs is not None else None)
        seq_len = policy.seq_len or n_steps
        states_buf = np.zeros((-(-n_steps // seq_len), n, policy.state.shape[1]), np.float32)
    rng = np.random.default_rng(action_seed)
    spec = policy.spec
    low = np.asarray(spec.action_low, dtype=np.float32) if not spec.discrete else None
    high = np.asarray(spec.action_high, dtype=np.float32) if not spec.discrete else None

    obs_buf = np.zeros((n_steps, n, *spec.obs_shape), spec.obs_dtype)
    act_buf = np.zeros((n_steps, n, *spec.action_shape), spec.action_dtype)
    logp_buf = np.zeros((n_steps, n), np.float32)
    val_buf = np.zeros((n_steps, n), np.float32)
    rew_buf = np.zeros((n_steps, n), np.float32)
    done_buf = np.zeros((n_steps, n), bool)
    final_val_buf = np.zeros((n_steps, n), np.float32)
    next_obs_buf = np.zeros((n_steps, n, *spec.obs_shape), spec.obs_dtype) if keep_next_obs else None
    term_buf = np.zeros((n_steps, n), bool) if keep_next_obs else None
    masked = spec.action_mask
    mask_buf = np.zeros((n_steps, n, spec.action_dim), bool) if masked else None
    next_mask_buf = np.zeros((n_steps, n, spec.action_dim), bool) if masked and keep_next_obs else None
    ep_returns: list[float] = []
    ep_lengths: list[int] = []
    ep_columns: list[int] | None = [] if spec.policies else None
    if stream is not None and stream.obs is not None:
        obs, running_return, running_length = stream.obs, stream.episode_return, stream.episode_length
        mask = None  # (masked envs are refused "continue": config.checks)
    else:
        obs, reset_info = envs.reset(seed=stream.first_seeds if stream is not None else env_seeds)
        obs = as_obs(spec, obs, n)
        mask = legal_actions(spec, reset_info, n)
        running_return = np.zeros(n, np.float64)
        running_length = np.zeros(n, np.int64)
    no_flags = np.zeros(n, bool)  # read-only default of the per-step info flags
    all_active = np.ones(n, bool)
    # An env's info["active"]: which agents act next (agents not in their game yet: from the reset on).
    active = all_active if stream is not None and stream.obs is not None else reset_info.get("active", all_active)
    active_buf = None
    for t in range(n_steps):
        if refresh is not None and t and t % refresh_steps == 0:
            newer = refresh()
            if newer is not None:
                if recurrent:  # the newer weights go on from the state the older ones left
                    newer.begin(n, policy.state)
                policy = newer
        if states_buf is not None and t % seq_len == 0:
            states_buf[t // seq_len] = policy.state
        if mask is None:
            action, logprob, value = policy.act(obs, rng, deterministic)
        else:
            action, logprob, value = policy.act(obs, rng, deterministic, mask=mask)
            mask_buf[t] = mask
        env_action = action if spec.discrete else np.clip(action, low, high)
        next_obs, reward, terminated, truncated, info = envs.step(env_action)

        obs_buf[t], act_buf[t], logp_buf[t], val_buf[t], rew_buf[t] = obs, action, logprob, value, reward
        done = terminated | truncated
        # A life lost (Atari, env.terminal_on_life_loss) is a termination for learning, but the game
        # and its episode go on: no reset, no episode reported.
        life_lost = _info_values(info, "life_lost", done, no_flags)
        terminated = terminated | life_lost
        done_buf[t] = done | life_lost
        # Truncated (not terminated) episodes continue in truth: bootstrap from the value of the
        # real final observation, which SAME_STEP autoreset leaves in info["final_obs"].
        cut = truncated & ~terminated
        if cut.any():
            rows = np.flatnonzero(cut)
            final_obs = as_obs(spec, np.stack([info["final_obs"][i] for i in rows]), len(rows))
            # Several policies (rlfarm.algos.group): which policy values a row depends on its sub-env;
            # a recurrent one's, on the row's state after this step.
            rowwise = spec.policies or recurrent
            final_val_buf[t, cut] = policy.value(final_obs, rows=rows) if rowwise else policy.value(final_obs)
        next_obs = as_obs(spec, next_obs, n)
        if keep_next_obs:
            next_obs_buf[t] = next_obs
            for i in np.flatnonzero(done):
                next_obs_buf[t, i] = as_obs(spec, info["final_obs"][i], 1)[0]
            term_buf[t] = terminated
        if masked:
            mask = legal_actions(spec, info, n)
            if next_mask_buf is not None:
                next_mask_buf[t] = mask
                ended = done & np.asarray(info.get("final_info", {}).get("_action_mask", no_flags), bool)
                for i in np.flatnonzero(ended):  # the final observation's own legal actions
                    next_mask_buf[t, i] = info["final_info"]["action_mask"][i]

        # The episode's score as the env reports it: rewards clipped for learning (Atari) keep the
        # real one in info["raw_reward"].
        running_return += _info_values(info, "raw_reward", done, reward)
        running_length += active
        if active_buf is None and not active.all():
            active_buf = np.ones((n_steps, n), bool)
        if active_buf is not None:
            active_buf[t] = active
        active = info.get("active", all_active)
        for i in np.flatnonzero(done):
            ep_returns.append(float(running_return[i]))
            ep_lengths.append(int(running_length[i]))
            if ep_columns is not None:
                ep_columns.append(int(i))
        running_return[done] = 0.0
        running_length[done] = 0
        if states_buf is not None:  # a new episode (or life: the learner resets where dones say) has no past
            policy.episodes_started(done_buf[t])
        obs = next_obs

    last_values = policy.value(obs)
    if stream is not None:
        stream.obs, stream.episode_return, stream.episode_length = obs, running_return, running_length
        stream.policy_state = None if states_buf is None else policy.state.copy()
    return Rollout(
        obs_buf,
        act_buf,
        logp_buf,
        val_buf,
        rew_buf,
        done_buf,
        final_val_buf,
        last_values,
        np.asarray(ep_returns, np.float64),
        np.asarray(ep_lengths, np.int64),
        next_obs_buf,
        term_buf,
        obs,
        active_buf,
        mask_buf,
        next_mask_buf,
        None if ep_columns is None else np.asarray(ep_columns, np.int64),
        states_buf,
    )


def legal_actions(spec: SpaceSpec, info: dict[str, Any], n: int) -> np.ndarray | None:
    """(n, action_dim) bool: the actions legal at the observations an env just returned
    (info["action_mask"]), None for an env without masks. A masked env that leaves it out allows all."""
    if not spec.action_mask:
        return None
    if "action_mask" not in info:
        return np.ones((n, spec.action_dim), bool)
    return np.asarray(info["action_mask"], bool).reshape(n, spec.action_dim)


def _info_values(info: dict[str, Any], key: str, done: np.ndarray, default: np.ndarray) -> np.ndarray:
    """A per-step info key of a vector env as (n,) values, `default` where no sub-env set it. Where
    an episode ended, SAME_STEP autoreset puts the reset's info in `info` and the step's own in
    info["final_info"]: read it from there."""
    final_info = info.get("final_info", {})
    if key not in info and key not in final_info:  # most envs, every step: no copy, no work
        return default
    values = np.array(default, copy=True)
    for source, rows in ((info, ~done), (final_info, done)):
        if key in source:
            present = np.asarray(source.get(f"_{key}", np.ones(len(values), bool)), bool) & rows
            values[present] = np.asarray(source[key])[present]
    return values


def concat(rollouts: list[Rollout]) -> Rollout:
    """Join tasks side by side along the env axis, in the order given (task-index order)."""
    step_fields = ("obs", "actions", "logprobs", "values", "rewards", "dones", "final_values")
    joined = {k: np.concatenate([getattr(r, k) for r in rollouts], axis=1) for k in step_fields}
    joined["last_values"] = np.concatenate([r.last_values for r in rollouts])
    joined["episode_returns"] = np.concatenate([r.episode_returns for r in rollouts])
    joined["episode_lengths"] = np.concatenate([r.episode_lengths for r in rollouts])
    for k in ("next_obs", "terminations", "action_masks", "next_action_masks"):
        parts = [getattr(r, k) for r in rollouts]
        joined[k] = None if any(p is None for p in parts) else np.concatenate(parts, axis=1)
    parts = [r.last_obs for r in rollouts]
    joined["last_obs"] = None if any(p is None for p in parts) else np.concatenate(parts)
    parts = [r.states for r in rollouts]
    joined["states"] = None if any(p is None for p in parts) else np.concatenate(parts, axis=1)
    if all(r.episode_columns is not None for r in rollouts):  # columns of the joined rollout
        offsets = np.cumsum([0] + [r.rewards.shape[1] for r in rollouts[:-1]])
        joined["episode_columns"] = np.concatenate([r.episode_columns + o for r, o in zip(rollouts, offsets)])
    if any(r.active is not None for r in rollouts):
        joined["active"] = np.concatenate(
            [r.active if r.active is not None else np.ones(r.rewards.shape, bool) for r in rollouts], axis=1
        )
    return Rollout(**joined)


# A greedy episode its env has not ended after this many steps is cut there (its return so far counts):
# every run evaluates its final policy, and an env whose episodes never end would otherwise hold that
# evaluation until its task's time limit, again and again. An Atari game's own limit is 108,000 frames.
MAX_EPISODE_STEPS = 108_000


def _mean_of(total: np.ndarray, played: np.ndarray, columns: np.ndarray) -> float:
    """The mean return of the agents of `columns` that were in the game (all of them, if none was)."""
    mine = columns[played[columns]]
    return float(total[mine if len(mine) else columns].mean())


def run_episodes(
    policy: Actor,
    env: Any,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_steps: int = MAX_EPISODE_STEPS,
    by_policy: bool = False,
) -> np.ndarray:
    """Returns of `episodes` whole episodes (at most `max_steps` steps each) on a single (non-vector)
    env, greedy by default. A multi-agent env (one game of rlfarm.envs.agents.AgentVector, a vector of
    its agents): an episode is a game, its return the mean of its agents' returns; a turn-based game
    (rlfarm.envs.turns.TurnVector of one game): the learner's return against the env's opponent.
    Several policies (`SpaceSpec.policies`): a game's return is the first policy's agents' mean, or
    with `by_policy` a row of each policy's agents' mean, in the map's order (episodes x policies)."""
    rng = np.random.default_rng(seed)
    spec = policy.spec
    if getattr(env, "num_envs", None) is not None:
        table = _game_episodes(policy, env, episodes, seed, rng, deterministic, max_steps)
        return table if by_policy and spec.policies else table[:, 0]
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        if getattr(policy, "recurrent", False):  # its memory starts empty with each episode
            policy.begin(1)
        total, done, steps = 0.0, False, 0
        while not done and steps < max_steps:
            action, _, _ = policy.act(as_obs(spec, obs, 1), rng, deterministic)
            a = action[0] if spec.discrete else np.clip(action[0], spec.action_low, spec.action_high)
            obs, reward, terminated, truncated, info = env.step(a)
            total += float(info.get("raw_reward", reward))  # the game score, not the clipped reward
            done, steps = terminated or truncated, steps + 1
        returns.append(total)
    return np.asarray(returns)


def _game_episodes(
    policy: Actor, env: Any, episodes: int, seed: int, rng: np.random.Generator, deterministic: bool, max_steps: int
) -> np.ndarray:
    """run_episodes on one game of a multi-agent vector: every agent in the game acts each step, until
    every agent is done (the game ends) or max_steps are taken. A row per game: each policy's agents'
    mean return (one column without several policies)."""
    spec, n = policy.spec, env.num_envs
    returns = []
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        if getattr(policy, "recurrent", False):
            policy.begin(n)
        total, steps, finished = np.zeros(n), 0, np.zeros(n, bool)
        played = np.array(info.get("active", np.ones(n, bool)), bool)  # agents in the game (some join later)
        while steps < max_steps and not finished.all():  # an agent done early waits for the others
            mask = legal_actions(spec, info, n)
            if mask is None:
                action, _, _ = policy.act(as_obs(spec, obs, n), rng, deterministic)
            else:
                action, _, _ = policy.act(as_obs(spec, obs, n), rng, deterministic, mask=mask)
            if not spec.discrete:
                action = np.clip(action, spec.action_low, spec.action_high)
            obs, reward, terminated, truncated, info = env.step(action)
            total += reward
            steps += 1
            finished |= terminated | truncated
            if np.asarray(info.get("game_ended", finished), bool).all():  # (agents that never joined)
                break
            played |= np.asarray(info.get("active", np.ones(n, bool)), bool)
        played |= finished
        if spec.policies:
            returns.append([_mean_of(total, played, spec.columns(name, n)) for name in spec.policies])
        else:
            returns.append([_mean_of(total, played, np.arange(n))])
    return np.asarray(returns, dtype=np.float64).reshape(episodes, -1)

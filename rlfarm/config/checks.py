"""A RunConfig's semantic checks, those its fields' types cannot express; the algorithm's own
section checks itself (`AlgoSection.check`)."""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from rlfarm.config.run import ALGORITHMS, COMPRESS, DEVICES, MODES, POLICY_DTYPES, REFERENCES
from rlfarm.errors import ConfigError
from rlfarm.sections.algo import at_least_1, get
from rlfarm.sections.bounds import check_config_bounds

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig


def validate(config: RunConfig) -> None:
    """Semantic checks that types alone cannot express; the algorithm's own section checks itself."""
    if config.algo not in ALGORITHMS:
        close = difflib.get_close_matches(config.algo, list(ALGORITHMS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown algo {config.algo!r}{hint}; available: {', '.join(sorted(ALGORITHMS))}")
    if config.mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    if config.reference not in REFERENCES:
        raise ConfigError(f'reference must be sb3, cleanrl, rllib or "" (none), got {config.reference!r}')
    if config.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {config.device!r}")
    at_least_1(
        config,
        "env.num_envs",
        "env.frame_stack",
        "env.screen_size",
        "farm.num_tasks",
        "farm.steps_per_env",
        "farm.keep_versions",
        "total_steps",
        "async.publish_interval",
        "eval.episodes",
        "eval.tasks",
    )
    for key in ("farm.workers", "torch_threads"):
        if get(config, key) < 0:
            raise ConfigError(f'{key} must be at least 1, or 0 ("auto"), got {get(config, key)}')
    if config.farm.keep_versions < 2:
        raise ConfigError("farm.keep_versions must be at least 2 (the acting and the newest version)")
    if config.seed < 0:  # numpy seeds must be >= 0: a negative one would fail only on the workers
        raise ConfigError(f"seed must be a non-negative integer, got {config.seed}")
    if config.checkpoint_interval < 0:
        raise ConfigError("checkpoint_interval cannot be negative")
    for key in (
        "farm.task_timeout",
        "farm.lease_seconds",
        "farm.redis_outage_timeout",
        "farm.max_result_bytes",
        "farm.share",
    ):
        if not get(config, key) > 0:
            raise ConfigError(f"{key} must be positive, got {get(config, key)}")
    if config.farm.task_time_limit < 0:
        raise ConfigError("farm.task_time_limit cannot be negative (0: derived from the task durations)")
    if config.env.preprocess not in ("auto", "atari", "none"):
        raise ConfigError(f"env.preprocess must be auto, atari or none, got {config.env.preprocess!r}")
    if config.env.noop_max < 0:
        raise ConfigError("env.noop_max cannot be negative")
    if config.farm.episodes not in ("fresh", "continue"):
        raise ConfigError(f"farm.episodes must be fresh or continue, got {config.farm.episodes!r}")
    if config.farm.max_redispatch < 0:
        raise ConfigError("farm.max_redispatch cannot be negative")
    if config.farm.compress not in COMPRESS:
        raise ConfigError(f"farm.compress must be one of {', '.join(COMPRESS)}, got {config.farm.compress!r}")
    if config.farm.policy_dtype not in POLICY_DTYPES:
        raise ConfigError(
            f"farm.policy_dtype must be one of {', '.join(POLICY_DTYPES)}, got {config.farm.policy_dtype!r}"
        )
    policy = config.policy
    if policy.activation not in ("tanh", "relu"):
        raise ConfigError(f"policy.activation must be tanh or relu, got {policy.activation!r}")
    if not policy.hidden_sizes or min(policy.hidden_sizes) < 1:
        raise ConfigError("policy.hidden_sizes must be a non-empty list of positive sizes")
    cnn = (policy.cnn_channels, policy.cnn_kernels, policy.cnn_strides)
    if not policy.cnn_channels or len({len(x) for x in cnn}) != 1 or min(min(x) for x in cnn) < 1:
        raise ConfigError(
            "policy.cnn_channels, policy.cnn_kernels and policy.cnn_strides must be lists of "
            "positive integers of the same length (one entry per convolution)"
        )
    at_least_1(config, "policy.cnn_features")
    if policy.cnn_padding not in ("valid", "same"):
        raise ConfigError(f"policy.cnn_padding must be valid or same, got {policy.cnn_padding!r}")
    if policy.init not in ("orthogonal", "xavier"):
        raise ConfigError(f"policy.init must be orthogonal or xavier, got {policy.init!r}")
    if not policy.obs_scale > 0:
        raise ConfigError(f"policy.obs_scale must be positive, got {policy.obs_scale}")
    if not config.policy.normalize_clip > 0:
        raise ConfigError(f"policy.normalize_clip must be positive, got {config.policy.normalize_clip}")
    if config.eval.confirm_episodes < 0:
        raise ConfigError("eval.confirm_episodes cannot be negative (0: no confirmation)")
    if config.async_.max_policy_lag < 0 or config.eval.interval < 0:
        raise ConfigError("async.max_policy_lag and eval.interval cannot be negative")
    if config.async_.refresh_steps < 0:
        raise ConfigError("async.refresh_steps cannot be negative (0: a task acts with one version)")
    if config.async_.ingest not in ("thread", "inline"):
        raise ConfigError(f"async.ingest must be thread or inline, got {config.async_.ingest!r}")
    # More results an update than tasks in flight is allowed: the batch fills over several rounds of
    # tasks, as a big farm fills it in one, so what a run learns is its config's whatever the farm.
    if config.async_.results_per_update < 0 or config.async_.tasks_in_flight < 0:
        raise ConfigError("async.results_per_update and async.tasks_in_flight cannot be negative")
    check_selfplay(config)
    check_policies(config)
    check_recurrent(config)
    check_config_bounds(config)  # after the lower bounds, so a 0 is not reported as a bound
    config.algo_config.check(config)
    if config.run_id and not all(c.isalnum() or c in "-_." for c in config.run_id):
        raise ConfigError(f"run_id may hold letters, digits, '-', '_' and '.', got {config.run_id!r}")


RECURRENT = ("lstm", "gru")


def check_recurrent(config: RunConfig) -> None:
    """A recurrent policy (policy.recurrent): what is built for it, and sequences that fit in a task."""
    policy = config.policy
    if policy.recurrent == "":
        if policy.burn_in:
            raise ConfigError(
                f"policy.burn_in = {policy.burn_in} refreshes a recurrent policy's state; set policy.recurrent"
            )
        return
    if policy.recurrent not in RECURRENT:
        raise ConfigError(f'policy.recurrent must be lstm, gru or "" (none), got {policy.recurrent!r}')
    section = type(config.algo_config)
    if not section.recurrent_modes:
        able = ", ".join(name for name, s in ALGORITHMS.items() if s.recurrent_modes)
        raise ConfigError(
            f"policy.recurrent = {policy.recurrent!r}: {config.algo} learns feed-forward policies only (a frame "
            f"stack, env.frame_stack, gives it a short memory); recurrent policies are learned by {able}"
        )
    if config.mode not in section.recurrent_modes:
        raise ConfigError(
            f"policy.recurrent = {policy.recurrent!r}: {config.algo} learns recurrent policies in mode "
            f"{' or '.join(section.recurrent_modes)} only; not in mode {config.mode} yet"
        )
    if config.env.policy_map:
        raise ConfigError("policy.recurrent with several policies (env.policy_map) is not built yet")
    if config.ppo.compile != "none" or config.ppo.precision != "fp32":
        raise ConfigError("policy.recurrent learns in eager fp32: ppo.compile = none and ppo.precision = fp32")
    at_least_1(config, "policy.recurrent_size")
    steps = config.farm.steps_per_env
    if policy.seq_len < 0:
        raise ConfigError(f"policy.seq_len cannot be negative (0: a whole task), got {policy.seq_len}")
    if policy.seq_len > steps:
        raise ConfigError(
            f"policy.seq_len = {policy.seq_len} is longer than a task (farm.steps_per_env = {steps}): "
            f"a sequence never crosses tasks; make it at most {steps}, or 0 for a whole task"
        )
    if policy.seq_len and steps % policy.seq_len:
        raise ConfigError(
            f"policy.seq_len = {policy.seq_len} does not divide farm.steps_per_env = {steps}: a task is cut "
            f"into whole sequences"
        )
    length = policy.seq_len or steps
    if not 0 <= policy.burn_in < length:
        raise ConfigError(
            f"policy.burn_in = {policy.burn_in}: a sequence's burn-in is 0 (none) to {length - 1} steps, "
            f"shorter than the sequence (policy.seq_len, or farm.steps_per_env where it is 0)"
        )


def parse_frozen(entries: tuple[str, ...]) -> list[tuple[str, str]]:
    """`frozen`'s "policy=file" entries as (policy, file) pairs; ConfigError on a bad one."""
    pairs = []
    for entry in entries:
        policy, sep, path = (part.strip() for part in str(entry).partition("="))
        if not sep or not path:
            raise ConfigError(f"frozen entry {entry!r} is not 'policy=file' (a policy of env.policy_map and its file)")
        pairs.append((policy, path))
    return pairs


def parse_policy_settings(entries: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """`policy_settings`' "policy:key=value" entries as (policy, key, value text); ConfigError on a bad one."""
    triples = []
    for entry in entries:
        policy, colon, rest = (part.strip() for part in str(entry).partition(":"))
        key, equals, value = (part.strip() for part in rest.partition("="))
        if not (colon and equals and policy and key and value):
            raise ConfigError(
                f"policy_settings entry {entry!r} is not 'policy:key=value' (e.g. 'agent:ppo.learning_rate=1e-4')"
            )
        triples.append((policy, key, value))
    return triples


def check_policies(config: RunConfig) -> None:
    """env.policy_map and frozen, as far as the config alone tells (the agents are matched once the env
    is made, rlfarm.envs.agents)."""
    from rlfarm.envs.agents import parse_policy_map

    try:
        named = {policy for _, policy in parse_policy_map(config.env.policy_map)}
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    frozen = set()
    for policy, _ in parse_frozen(config.frozen):
        if policy not in named:
            raise ConfigError(
                f"frozen policy {policy!r} is not in env.policy_map ({', '.join(sorted(named)) or 'empty'})"
            )
        frozen.add(policy)
    if named and frozen == named:
        raise ConfigError("every policy of env.policy_map is frozen: at least one must be trained")
    section = ALGORITHMS[config.algo].algo
    for policy, key, _ in parse_policy_settings(config.policy_settings):
        if policy not in named:
            raise ConfigError(
                f"policy_settings names policy {policy!r}, which is not in env.policy_map "
                f"({', '.join(sorted(named)) or 'empty'})"
            )
        if key.partition(".")[0] != section:
            raise ConfigError(
                f"policy_settings entry for {policy!r}: only keys of the run's algorithm section [{section}] "
                f"may differ per policy, got {key!r}"
            )
        if policy in frozen:
            raise ConfigError(f"policy_settings entry for {policy!r}: that policy is frozen (it never learns)")


SELFPLAY_OPPONENTS = ("league", "random", "lookahead")
EVAL_OPPONENTS = ("random", "lookahead")


def check_selfplay(config: RunConfig) -> None:
    sp = config.selfplay
    if sp.opponents not in SELFPLAY_OPPONENTS:
        raise ConfigError(f"selfplay.opponents must be one of {', '.join(SELFPLAY_OPPONENTS)}, got {sp.opponents!r}")
    if sp.eval_opponent not in EVAL_OPPONENTS:
        raise ConfigError(
            f"selfplay.eval_opponent must be one of {', '.join(EVAL_OPPONENTS)}, got {sp.eval_opponent!r}"
        )
    if sp.league_size < 1 or sp.league_every < 1:
        raise ConfigError("selfplay.league_size and selfplay.league_every must be at least 1")
    for key in ("latest_share", "scripted_share"):
        if not 0.0 <= getattr(sp, key) <= 1.0:
            raise ConfigError(f"selfplay.{key} is a share of games, from 0 to 1, got {getattr(sp, key)}")
    if sp.scripted not in EVAL_OPPONENTS:
        raise ConfigError(f"selfplay.scripted must be one of {', '.join(EVAL_OPPONENTS)}, got {sp.scripted!r}")


def check_agents(config: RunConfig, agents: int) -> None:
    """A multi-agent env of `agents` agents (rlfarm.envs.agents): each game fills one sub-env per
    agent, so env.num_envs counts agents."""
    if config.env.num_envs % agents:
        low = max(agents, config.env.num_envs // agents * agents)
        raise ConfigError(
            f"env.num_envs = {config.env.num_envs} is not a multiple of the env's {agents} agents (each game "
            f"fills one sub-env per agent): try env.num_envs = {low}"
        )

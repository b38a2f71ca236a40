"""Upper bounds on every number that starts processes or allocates memory, PURE: config keys (checked
with the rest of a config, so presets, `--set` and the Python API meet the same refusal) and CLI
options (`rlfarm worker -c`, `rlfarm up -w`, `--seeds`, `--parallel`, ...).

Why: a typo (`--seeds 1-100000` for 1-10, `env.num_envs = 100000`) was accepted and only failed
minutes later, inside fork or the OOM killer. Each bound is generous (far above any shipped preset or
published setting) and refused in one line that names the key, the value and the bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfarm.errors import ConfigError
from rlfarm.sections.algo import get

if TYPE_CHECKING:
    from rlfarm.config.run import RunConfig

# Processes on one machine: the embedded farm's workers, `rlfarm worker -c`, `rlfarm up -w`, torch
# threads. The largest machines have a few hundred cores; a process per core is what rlfarm runs.
MAX_WORKERS = 1024
# Trainer subprocesses at once (`rlfarm sweep --parallel`, `rlfarm train --seeds --parallel`): each is
# a torch process of 0.3-1 GB resident with its own learner; 64 already fills a large machine.
MAX_PARALLEL_TRAINERS = 64
# Seeds of one `rlfarm train --seeds`: a run directory, log and trainer each; benchmarks report 5-10.
MAX_SEEDS = 1000
# Trials of one `rlfarm sweep` (each a whole run; Optuna's samplers slow down past a few thousand).
MAX_TRIALS = 10_000
# Tasks of a SYNC iteration, ASYNC tasks in flight, evaluation tasks: each is a broker message, a lease
# and a result held in Redis at once; 16k is a farm of hundreds of machines.
MAX_TASKS = 16_384
# Sub-envs stepped by one task in one worker process (GPU simulators batch 4096; CPU envs far fewer).
MAX_NUM_ENVS = 4096
# Env steps one sub-env takes in one task: a hundred 1000-step episodes.
MAX_STEPS_PER_ENV = 100_000
# Env steps of one task (env.num_envs x farm.steps_per_env) and of one SYNC iteration (x farm.num_tasks):
# a worker holds a task's arrays and the trainer an iteration's batch in memory at once. 2**20 is 16x
# IsaacGym's 4096 x 16 batch; at Atari's 28 KB per frame stack it is already 29 GB.
MAX_BATCH_STEPS = 2**20
# Episodes of one evaluation, its confirmation, `rlfarm eval --episodes`: returns are averaged; 10k
# episodes give a standard error of 1 % of the returns' std.
MAX_EPISODES = 10_000
# Replay transitions (a buffer is allocated whole at start; Atari's is 1M, Ape-X's 2M).
MAX_BUFFER_SIZE = 10_000_000
# Samples of one minibatch / gradient step (forward and backward activations of all at once).
MAX_BATCH_SIZE = 65_536
# Policy versions kept in Redis, each a copy of the network (the Nature CNN: 6.75 MB).
MAX_KEEP_VERSIONS = 1000
# Past versions self-play's league keeps pinned, each fetched and cached by the worker processes whose
# tasks play it (rlfarm.core.league); AlphaStar's leagues held hundreds of players.
MAX_LEAGUE = 256
# Batches APPO's circular buffer keeps (each one task's result or more).
MAX_BUFFER_BATCHES = 1024
# Units of one layer (hidden_sizes, cnn_channels, cnn_features): a 16384-wide dense layer is 1 GB
# of float32 weights, times Adam's two moments.
MAX_LAYER_WIDTH = 16_384
MAX_LAYERS = 64  # entries of hidden_sizes and of the CNN's lists (ResNets reach 152 with skips; these have none)
# Observation preprocessing: frames stacked, and the side of the resized square frame (ALE's screen is
# 210 x 160: larger only allocates).
MAX_FRAME_STACK = 64
MAX_SCREEN_SIZE = 1024
# A result's size on the wire: Redis refuses a value over 512 MiB.
MAX_RESULT_BYTES = 512 * 2**20
# Passes over one batch (ppo.update_epochs, APPO's ppo.batch_passes): each is a forward and backward
# over the whole batch; published settings use 1-32, and 1e9 spun the learner until it was killed.
MAX_PASSES = 1000
# Gradient steps per env step of an off-policy learner (replay_ratio): the usual 0.25-1, the
# high-replay-ratio papers 16-128.
MAX_REPLAY_RATIO = 256
# Characters of env.id, a gymnasium id or "module:callable" (the longest registered ids are ~40): a
# 50 MB id was echoed whole in its error line.
MAX_ENV_ID_CHARS = 256
# Learning rates: (0, 1]. Adam moves each weight by about the learning rate per step, so above 1 every
# step rewrites the network; 1e6 (a typo for 1e-6) only produced NaNs after the farm had started.
MAX_LEARNING_RATE = 1.0

# Config keys and their bounds, checked by `check_config_bounds` for every run. The algorithms'
# sections check their own keys (`at_most`, `check_learning_rate`).
CONFIG_BOUNDS: dict[str, int] = {
    "farm.workers": MAX_WORKERS,
    "torch_threads": MAX_WORKERS,
    "farm.num_tasks": MAX_TASKS,
    "async.tasks_in_flight": MAX_TASKS,
    "async.results_per_update": MAX_TASKS,
    "eval.tasks": MAX_TASKS,
    "env.num_envs": MAX_NUM_ENVS,
    "farm.steps_per_env": MAX_STEPS_PER_ENV,
    "eval.episodes": MAX_EPISODES,
    "eval.confirm_episodes": MAX_EPISODES,
    "farm.keep_versions": MAX_KEEP_VERSIONS,
    "selfplay.league_size": MAX_LEAGUE,
    "farm.max_result_bytes": MAX_RESULT_BYTES,
    "env.frame_stack": MAX_FRAME_STACK,
    "env.screen_size": MAX_SCREEN_SIZE,
    "policy.cnn_features": MAX_LAYER_WIDTH,
    "policy.recurrent_size": MAX_LAYER_WIDTH,
}


def at_most(config: RunConfig, key: str, bound: int | float) -> None:
    """Refuse `key` above `bound`, in one line naming both (a list of layer sizes: its largest)."""
    value = get(config, key)
    if isinstance(value, tuple):
        value = max(value, default=0)
    if value > bound:
        raise ConfigError(f"{key} = {value:,} is above its bound of {bound:,} (rlfarm/sections/bounds.py says why)")


def check_config_bounds(config: RunConfig) -> None:
    """Every run-wide key's upper bound, and the batch a task and a SYNC iteration hold."""
    if len(config.env.id) > MAX_ENV_ID_CHARS:
        raise ConfigError(
            f"env.id is {len(config.env.id):,} characters long, above its bound of {MAX_ENV_ID_CHARS} "
            f"(it begins {config.env.id[:40]!r})"
        )
    for key, bound in CONFIG_BOUNDS.items():
        at_most(config, key, bound)
    for key in ("policy.hidden_sizes", "policy.cnn_channels"):
        at_most(config, key, MAX_LAYER_WIDTH)
        if len(get(config, key)) > MAX_LAYERS:
            raise ConfigError(f"{key} has {len(get(config, key)):,} layers, above its bound of {MAX_LAYERS}")
    task = config.env.num_envs * config.farm.steps_per_env
    if task > MAX_BATCH_STEPS:
        raise ConfigError(
            f"a task of env.num_envs x farm.steps_per_env = {config.env.num_envs:,} x "
            f"{config.farm.steps_per_env:,} = {task:,} env steps is above its bound of "
            f"{MAX_BATCH_STEPS:,} (a worker holds them in memory at once)"
        )
    if config.mode == "sync" and config.steps_per_iteration > MAX_BATCH_STEPS:
        raise ConfigError(
            f"a SYNC iteration of farm.num_tasks x env.num_envs x farm.steps_per_env = "
            f"{config.steps_per_iteration:,} env steps is above its bound of {MAX_BATCH_STEPS:,} "
            f"(the trainer holds them in memory at once)"
        )


def check_learning_rate(config: RunConfig, key: str) -> None:
    """A learning rate in (0, MAX_LEARNING_RATE]."""
    value = get(config, key)
    if not 0 < value <= MAX_LEARNING_RATE:  # NaN fails too
        raise ConfigError(
            f"{key} = {value:g} is outside (0, {MAX_LEARNING_RATE:g}]: a learning rate must be "
            f"positive, and above {MAX_LEARNING_RATE:g} every step rewrites the network"
        )


def check_replay_bounds(config: RunConfig, section: str) -> None:
    """An off-policy section's replay buffer and minibatch."""
    at_most(config, f"{section}.buffer_size", MAX_BUFFER_SIZE)
    at_most(config, f"{section}.batch_size", MAX_BATCH_SIZE)
    at_most(config, f"{section}.replay_ratio", MAX_REPLAY_RATIO)


def check_replay_memory(
    config: RunConfig, obs_shape: tuple[int, ...], uint8: bool, action_values: int, memory: int
) -> None:
    """An off-policy run's replay buffer, allocated whole when the learner starts, must fit in the
    `memory` bytes of the trainer's machine: obs and next_obs (uint8 or float32), actions (8
    bytes a value at most), a float32 reward and a done flag per transition (rlfarm.core.replay)."""
    size = getattr(config.algo_config, "buffer_size", 0)
    obs = 1
    for n in obs_shape:
        obs *= int(n)
    need = size * (2 * obs * (1 if uint8 else 4) + 8 * action_values + 5)
    if memory and need > memory:
        key = f"{config.algo}.buffer_size"
        raise ConfigError(
            f"{key} = {size:,} transitions of {'x'.join(map(str, obs_shape))} observations need "
            f"about {need / 2**30:,.1f} GiB, more than this machine's {memory / 2**30:,.1f} GiB "
            f"of memory; lower {key}"
        )

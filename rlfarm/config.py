"""Run configuration: frozen dataclasses, TOML presets and `key=value` overrides.

A run is described by one `RunConfig`. Presets are TOML files whose tables mirror the dataclasses
(`[env]`, `[farm]`, `[policy]`, `[ppo]`); overrides use dotted keys (`ppo.learning_rate=1e-3`).
Everything here is pure: no Redis, no Celery, no files except reading presets.
"""

from __future__ import annotations

import dataclasses
import math
import difflib
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rlfarm.envs import SpaceSpec

MODES = ("sync", "async")
DEVICES = ("auto", "cpu", "cuda")
# farm.compress: rlfarm.codec.COMPRESS_CHOICES, repeated here so reading a config never imports the
# codec (and torch with it); tests/test_wire.py checks the two agree.
COMPRESS = ("auto", "none", "zstd")


class ConfigError(ValueError):
    """A preset, override or value that cannot make a valid run."""


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"  # gymnasium id, or "module:callable" returning an Env
    num_envs: int = 4  # sub-environments stepped together inside one rollout task
    # Preprocessing, done on the workers: "auto" is DeepMind's Atari preprocessing for ALE ids
    # (rlfarm.atari) and none for the rest; "atari" | "none" force it. The keys below are Atari's.
    preprocess: str = "auto"
    frame_stack: int = 4  # frames stacked into one observation
    noop_max: int = 30  # up to this many no-op actions at an episode's start
    terminal_on_life_loss: bool = False  # a lost life ends the episode for learning (not the game)
    clip_rewards: bool = True  # learn from the sign of the reward; episode returns stay the game score


@dataclass(frozen=True)
class FarmConfig:
    num_tasks: int = 4  # rollout tasks per SYNC iteration: fixed by the run, never by the worker count
    steps_per_env: int = 256  # env steps each sub-env takes in one task
    # Worker processes the embedded default starts; 0 ("auto"): half the machine's cores, at least 1
    # (local_workers), the split the Atari presets use: learner and actors then share the cores.
    workers: int = 2
    # A running task (one whose worker holds its lease) without a result this many seconds after it
    # started gets one backup copy; queued tasks are never late (see rlfarm.dispatch).
    task_timeout: float = 120.0
    max_redispatch: int = 3  # re-sends of one lost task after which the run fails instead of retrying
    keep_versions: int = 5  # policy versions retained in Redis
    lease_seconds: float = 10.0  # a running task's lease expiry: how soon a lost worker is noticed
    task_time_limit: float = 0.0  # hard limit on a task's run time on its worker; 0: 10x the longest seen
    redis_outage_timeout: float = 120.0  # seconds of Redis outage the trainer rides out before it stops
    max_result_bytes: int = 256 * 2**20  # a worker refuses to send a larger result (Redis caps at 512 MiB)
    # "fresh": every task starts its episodes anew (SYNC is bit-reproducible); "continue": each worker
    # process keeps its sub-envs running across tasks, so episodes may be longer than a task
    # (Atari, MuJoCo); not bit-reproducible (see rlfarm.rollout).
    episodes: str = "fresh"
    # Result arrays on the wire (rlfarm.codec): "auto" compresses large ones (zstd; Atari frame stacks
    # ~200x smaller), "zstd" pins that codec, "none" sends them raw. max_result_bytes is the compressed size.
    compress: str = "auto"


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP layers (vector observations)
    activation: str = "tanh"  # tanh | relu
    init_log_std: float = 0.0  # Gaussian policies: initial log standard deviation
    # Image observations: a Nature-CNN encoder (Mnih et al. 2015). Images too small for these
    # kernels get a small 3x3 encoder instead (rlfarm.policy.cnn_layers says which).
    cnn_channels: tuple[int, ...] = (32, 64, 64)
    cnn_kernels: tuple[int, ...] = (8, 4, 3)
    cnn_strides: tuple[int, ...] = (4, 2, 1)
    cnn_features: int = 512  # the encoder's output size (a linear layer after the convolutions)
    # Vector observations: normalise by running mean and variance, kept in the network's state (so
    # every version carries the statistics it acts with) and updated by the learner (rlfarm.normalize).
    normalize_obs: bool = False
    normalize_clip: float = 10.0  # normalised observations are clipped to [-clip, clip]


class AlgoSection:
    """The light half of an algorithm, what a config needs without importing torch: its name, the
    modes it runs in (and what each means), its checks. Its `[name]` config section is a frozen
    dataclass deriving from this; the learner is `rlfarm.algos.<name>` (see rlfarm.algos)."""

    algo: ClassVar[str]
    modes: ClassVar[dict[str, str]]  # mode -> what running in it means, for `--help` and errors
    mode_hint: ClassVar[str] = ""  # why the other modes are not supported

    def check(self, run: "RunConfig") -> None:
        """Raise ConfigError for values that cannot make a run (the section's own and how they fit
        the rest of the run)."""

    @classmethod
    def check_mode(cls, mode: str) -> None:
        if mode not in cls.modes:
            raise ConfigError(f"algo {cls.algo!r} cannot run in --mode {mode} (supported: "
                              f"{', '.join(cls.modes)})" + (f": {cls.mode_hint}" if cls.mode_hint else ""))

    @classmethod
    def check_spaces(cls, spec: "SpaceSpec") -> None:
        """Raise ConfigError when the algorithm cannot act in an env with these spaces."""

    def learner_forwards(self, run: "RunConfig") -> float | None:
        """What the learner spends per env step it consumes, in forwards of the network per observation
        (a forward-backward counts 3), for splitting a machine's cores between learner and workers
        (core_split); None: not modelled, the cores are split evenly."""
        return None


@dataclass(frozen=True)
class PPOConfig(AlgoSection):
    """[ppo]: PPO with the clipped surrogate objective (rlfarm.algos.ppo)."""

    algo: ClassVar[str] = "ppo"
    modes: ClassVar[dict[str, str]] = {
        "sync": "each iteration waits for all its tasks, acted with one version",
        "async": "APPO: results are used as they come, corrected for policy lag with V-trace"}

    learning_rate: float = 3e-4
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 4
    num_minibatches: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float = 0.0  # stop the epoch loop early above this approx-KL; 0 disables
    # ASYNC (APPO) only: V-trace's truncation of the importance weights pi/mu (Espeholt et al. 2018).
    rho_bar: float = 1.0  # of the weights on the TD errors and advantages
    c_bar: float = 1.0  # of the trace-cutting weights
    vtrace: bool = True  # false: take lagged results as on-policy (GAE), for ablations
    pg_loss: str = "clip"  # clip: PPO's clipped surrogate; impala: -log pi(a) * advantage
    # ASYNC only: what the surrogate's ratio is clipped around. "behaviour": the policy that acted (APPO);
    # "proximal": the network as the update begins (Hilton et al. 2021's decoupled PPO), so a lagged
    # result keeps PPO's full trust region and V-trace's truncated weights pi/mu do the correction.
    clip_to: str = "behaviour"

    def check(self, run: "RunConfig") -> None:
        _at_least_1(run, "ppo.update_epochs", "ppo.num_minibatches")
        if run.mode == "async":  # an update is a batch of whole results
            per_task = run.env.num_envs * run.farm.steps_per_env
            if per_task % self.num_minibatches:
                raise ConfigError(
                    f"ppo.num_minibatches ({self.num_minibatches}) must divide the steps of one task "
                    f"({per_task} = env.num_envs x farm.steps_per_env)")
        else:
            batch = run.steps_per_iteration
            if batch % self.num_minibatches:
                raise ConfigError(
                    f"ppo.num_minibatches ({self.num_minibatches}) must divide the steps per iteration "
                    f"({batch} = farm.num_tasks x env.num_envs x farm.steps_per_env)")
        for key in ("rho_bar", "c_bar"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"ppo.{key} must be positive, got {getattr(self, key)}")
        if self.pg_loss not in ("clip", "impala"):
            raise ConfigError(f"ppo.pg_loss must be clip or impala, got {self.pg_loss!r}")
        if self.clip_to not in ("behaviour", "proximal"):
            raise ConfigError(f"ppo.clip_to must be behaviour or proximal, got {self.clip_to!r}")

    def learner_forwards(self, run: "RunConfig") -> float | None:
        # Each epoch is a forward-backward per sample; in ASYNC, V-trace's targets take one more forward
        # over the batch first, except in APPO's one pass (rlfarm.algos.appo), where the loss's forward
        # gives them (SYNC learns from the values the workers computed).
        targets = run.mode == "async" and not (self.update_epochs == 1 and self.vtrace)
        return 3.0 * self.update_epochs + (1.0 if targets else 0.0)


@dataclass(frozen=True)
class DQNConfig(AlgoSection):
    """[dqn]: Double DQN with n-step returns and optional prioritized replay (rlfarm.algos.dqn)."""

    algo: ClassVar[str] = "dqn"
    modes: ClassVar[dict[str, str]] = {
        "async": "tasks act with the newest version when they start; results feed a replay buffer"}
    mode_hint: ClassVar[str] = "it learns from a replay buffer and never waits for whole groups"

    learning_rate: float = 1e-3
    anneal_lr: bool = False  # decay the learning rate linearly to 0 over total_steps
    gamma: float = 0.99
    n_step: int = 1  # n-step returns, computed inside each task's transitions
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1_000  # heatup: random actions, no training, until this many transitions
    replay_ratio: float = 0.5  # gradient steps per consumed env step
    target_update_interval: int = 250  # gradient steps between hard target updates (tau = 1)
    tau: float = 1.0  # 1: hard copy every target_update_interval; < 1: Polyak every gradient step
    max_grad_norm: float = 10.0
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    exploration_fraction: float = 0.1  # of total_steps over which epsilon decays linearly
    prioritized: bool = False
    per_alpha: float = 0.6
    per_beta: float = 0.4  # importance-sampling exponent, annealed to 1 over the run
    per_eps: float = 1e-6

    def check(self, run: "RunConfig") -> None:
        _check_replay(run, "dqn")
        _at_least_1(run, "dqn.target_update_interval")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"dqn.tau must be in (0, 1], got {self.tau}")

    @classmethod
    def check_spaces(cls, spec: "SpaceSpec") -> None:
        if not spec.discrete:
            raise ConfigError("algo 'dqn' needs a discrete action space; use ppo for continuous actions")


@dataclass(frozen=True)
class SACConfig(AlgoSection):
    """[sac]: Soft Actor-Critic with automatic entropy tuning (Haarnoja et al. 2018; rlfarm.algos.sac).
    Names and defaults as CleanRL's sac_continuous_action and SB3's SAC."""

    algo: ClassVar[str] = "sac"
    modes: ClassVar[dict[str, str]] = {
        "async": "tasks act with the newest version when they start; results feed a replay buffer"}
    mode_hint: ClassVar[str] = ("SAC learns off-policy from a replay buffer, so it never waits for whole "
                                "groups acted with one version; use --mode async")

    learning_rate: float = 3e-4  # actor, both critics and the entropy coefficient (one, as SB3)
    gamma: float = 0.99
    tau: float = 0.005  # Polyak coefficient of the target critics
    n_step: int = 1  # n-step returns, computed inside each task's transitions
    batch_size: int = 256
    buffer_size: int = 1_000_000
    learning_starts: int = 5_000  # heatup: uniform random actions in the bounds, no training
    replay_ratio: float = 1.0  # gradient steps per consumed env step (CleanRL and SB3: one per step)
    # CleanRL's delayed policy updates (TD3's trick): every policy_frequency gradient steps the actor
    # (and alpha) take policy_frequency steps, so they get as many steps as the critics.
    policy_frequency: int = 2
    target_network_frequency: int = 1  # gradient steps between Polyak updates of the target critics
    autotune: bool = True  # tune the entropy coefficient towards a target entropy of -action_dim
    initial_alpha: float = 1.0  # where autotune starts (SB3's "auto"; CleanRL's log_alpha = 0)
    alpha: float = 0.2  # the fixed entropy coefficient when autotune = false
    prioritized: bool = False  # prioritized replay by the critics' mean absolute TD error
    per_alpha: float = 0.6
    per_beta: float = 0.4  # importance-sampling exponent, annealed to 1 over the run
    per_eps: float = 1e-6

    def check(self, run: "RunConfig") -> None:
        _check_replay(run, "sac")
        _at_least_1(run, "sac.policy_frequency", "sac.target_network_frequency")
        if not 0 < self.tau <= 1:
            raise ConfigError(f"sac.tau must be in (0, 1], got {self.tau}")
        if not self.learning_rate > 0:
            raise ConfigError(f"sac.learning_rate must be positive, got {self.learning_rate}")
        if not self.initial_alpha > 0:  # autotune learns log(alpha)
            raise ConfigError(f"sac.initial_alpha must be positive, got {self.initial_alpha}")
        if self.alpha < 0:
            raise ConfigError(f"sac.alpha cannot be negative, got {self.alpha}")

    @classmethod
    def check_spaces(cls, spec: "SpaceSpec") -> None:
        if spec.discrete:
            raise ConfigError(f"algo 'sac' needs a Box (continuous) action space, the env has "
                              f"{spec.action_dim} discrete actions; use ppo or dqn for discrete actions")
        bounds = (*spec.action_low, *spec.action_high)
        if not all(math.isfinite(x) for x in bounds):
            raise ConfigError(f"algo 'sac' scales its tanh-squashed actions to the action space's bounds "
                              f"and needs finite ones, the env's are low={list(spec.action_low)} "
                              f"high={list(spec.action_high)}; wrap the env in gymnasium's RescaleAction "
                              f"with finite bounds, or use ppo")


@dataclass(frozen=True)
class AsyncConfig:
    tasks_in_flight: int = 0  # 0: one per online worker process (at least 2)
    # APPO: results per update (0: as many as tasks in flight); more could never be in flight at once.
    results_per_update: int = 0
    # Results acted with a version older than this many versions are dropped; 0 ("auto"): derived
    # from the tasks in flight (rlfarm.trainer.auto_policy_lag).
    max_policy_lag: int = 8
    publish_interval: int = 32  # gradient steps between published versions
    # A running task checks for a newer version every this many steps and acts with it from then on,
    # as IMPALA's actors do (0: a task acts with the version it started with throughout). With tasks
    # longer than an update, most steps then act with the newest version: APPO needed ~20 % fewer env
    # steps and less time (benchmarks/appo.py, sleep-bound env).
    refresh_steps: int = 64


@dataclass(frozen=True)
class EvalConfig:
    interval: int = 0  # env steps between greedy evaluations (0: never)
    episodes: int = 10  # episodes per evaluation, split over `tasks` tasks
    tasks: int = 2
    # An evaluation at or above target_return is confirmed by this many more greedy episodes with
    # other seeds before the run counts the target as reached (0: the first evaluation decides).
    confirm_episodes: int = 20


@dataclass(frozen=True)
class RunConfig:
    description: str = ""
    algo: str = "ppo"
    mode: str = "sync"
    seed: int = 1
    total_steps: int = 100_000
    target_return: float = math.inf  # stop early once the mean of the last 20 episodes reaches it
    device: str = "auto"
    run_id: str = ""  # empty: generated at start
    logdir: str = "runs"
    # Trainer threads; 0 ("auto", trainer_threads): one for MLPs (fastest and reproducible at their
    # sizes), for CNNs the cores the embedded default's local workers leave free.
    torch_threads: int = 0
    # Trainer checkpoint (for --resume) at most every this many seconds, at a published version, and at
    # the end; 0: at every published version. Off-policy replay buffers are saved with it when checkpoint_replay.
    checkpoint_interval: float = 10.0
    checkpoint_replay: bool = True
    env: EnvConfig = field(default_factory=EnvConfig)
    farm: FarmConfig = field(default_factory=FarmConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    @property
    def algo_config(self) -> AlgoSection:
        """The section of this run's algorithm (cfg.ppo for algo "ppo")."""
        return getattr(self, ALGORITHMS[self.algo].algo)

    @property
    def steps_per_iteration(self) -> int:
        return self.farm.num_tasks * self.env.num_envs * self.farm.steps_per_env

    @property
    def num_iterations(self) -> int:
        """SYNC iterations: total_steps rounded UP to whole iterations (a run never stops short of
        --total-steps, and its progress bar fills); `rounding_note` says so when it rounds."""
        return max(1, -(-self.total_steps // self.steps_per_iteration))

    def rounding_note(self) -> str | None:
        """One line for the console when SYNC total_steps is not a whole number of iterations (ASYNC
        runs until env_steps >= total_steps and never rounds); None when nothing is rounded."""
        per = self.steps_per_iteration
        if self.mode != "sync" or self.total_steps % per == 0:
            return None
        n, exact = self.num_iterations, self.total_steps / per
        shown = f"{exact:.2f}"
        if float(shown) in (n - 1, n):  # 0.001 or 9.9999 iterations: not "0.00" or "10.00"
            shown = f"{exact:.6g}"
        return (f"--total-steps {self.total_steps} is {shown} iterations of {per} "
                f"steps: training {n} iteration{'s' if n > 1 else ''} ({n * per:,} env steps)")


# Every algorithm's section, by name: the registry of what a config can name (the learners are
# found from these names by rlfarm.algos.learner).
ALGORITHMS: dict[str, type[AlgoSection]] = {section.algo: section
                                             for section in (PPOConfig, DQNConfig, SACConfig)}


def _at_least_1(run: RunConfig, *keys: str) -> None:
    for key in keys:
        if get(run, key) < 1:
            raise ConfigError(f"{key} must be at least 1, got {get(run, key)}")


def _check_replay(run: RunConfig, section: str) -> None:
    """The replay fields every off-policy section has (rlfarm.algos.offpolicy reads them)."""
    _at_least_1(run, f"{section}.batch_size", f"{section}.buffer_size", f"{section}.n_step")
    if get(run, f"{section}.replay_ratio") < 0:
        raise ConfigError(f"{section}.replay_ratio cannot be negative")


# `async` is a Python keyword: the field is `async_`, users and files say `async`.
_FIELD = {"async": "async_"}
_USER = {v: k for k, v in _FIELD.items()}


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def valid_keys() -> list[str]:
    """Every dotted key a preset or `--set` may name."""
    keys = []
    for name, tp in _hints(RunConfig).items():
        if dataclasses.is_dataclass(tp):
            keys += [f"{_USER.get(name, name)}.{sub}" for sub in _hints(tp)]
        else:
            keys.append(name)
    return sorted(keys)


# Integer keys whose 0 means "chosen for you"; "auto" may be written for it.
AUTO_KEYS = frozenset({"torch_threads", "farm.workers", "async.tasks_in_flight", "async.results_per_update",
                       "async.max_policy_lag"})


def machine_cores() -> int:
    """Cores this process may run on (its CPU affinity, as a container's cpuset limits it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# What a worker spends per env step of a CNN run, in forwards of the network per observation: its own
# forward at a task's batch, and the emulator's step (about 0.4 of one on Pong, benchmarks/pong.py).
ACTING_FORWARDS = 1.4


def acting_share(config: "RunConfig") -> float:
    """The workers' share of the CPU a CNN run's env step costs (actors and learner together), from
    the algorithm's cost model (AlgoSection.learner_forwards); 0.5 where it has none."""
    learner = config.algo_config.learner_forwards(config)
    return 0.5 if learner is None else ACTING_FORWARDS / (ACTING_FORWARDS + learner)


def local_workers(config: "RunConfig", cores: int | None = None) -> int:
    """Worker processes the embedded default starts: `farm.workers`, or for 0 ("auto") the cores'
    share the actors need (acting_share), at least 1. The learner paces an ASYNC run on one machine:
    a worker beyond that share would wait for it (pong, 2 epochs: 1 worker on 2 cores, 3 on 16)."""
    if config.farm.workers:
        return config.farm.workers
    return max(1, round((cores or machine_cores()) * acting_share(config)))


def trainer_threads(config: "RunConfig", image: bool, local: int, cores: int | None = None) -> int:
    """The trainer's torch threads: `torch_threads`, or for 0 ("auto") one for MLPs (per-op overhead
    dominates at their sizes, and one thread keeps SYNC bit-reproducible) and, for CNNs, the cores
    the `local` worker processes of this run on this machine leave: each uses at most the actors'
    share of the cores (acting_share), since the learner paces them. At least 1: more threads than
    free cores slow the learner down (OpenMP threads wait for each other whenever one is
    descheduled). Pong with 2 epochs on 2 cores: 1 worker and 2 threads; with one pass: 1 and 1
    (each the faster split there, benchmarks/pong.py)."""
    if config.torch_threads:
        return config.torch_threads
    if not image:
        return 1
    cores = cores or machine_cores()
    return max(1, round(cores - min(local, cores * acting_share(config))))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against the annotated type, converting only where no information is lost."""
    origin = typing.get_origin(tp)
    if origin is tuple:
        (item_tp, _) = typing.get_args(tp)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(key, v, item_tp) for v in value)
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: unsupported type {tp}")  # no optional fields by design
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if value == "auto" and key in AUTO_KEYS:
            return 0
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _unknown_key(key: str) -> ConfigError:
    keys = valid_keys()
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(keys)}")


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'ppo': {'gamma': 0.9}} -> {'ppo.gamma': 0.9}"""
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            flat.update(flatten(v, f"{prefix}{k}."))
        else:
            flat[f"{prefix}{k}"] = v
    return flat


def from_flat(values: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    """Build a RunConfig from dotted keys on top of `base` (defaults if None), validating each."""
    base = base or RunConfig()
    top_hints = _hints(RunConfig)
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        head, _, sub = key.partition(".")
        head = _FIELD.get(head, head)
        if head not in top_hints:
            raise _unknown_key(key)
        tp = top_hints[head]
        if dataclasses.is_dataclass(tp):
            sub_hints = _hints(tp)
            if sub not in sub_hints:
                raise _unknown_key(key)
            nested.setdefault(head, {})[sub] = _coerce(key, value, sub_hints[sub])
        else:
            if sub:
                raise _unknown_key(key)
            top[head] = _coerce(key, value, tp)
    for head, changes in nested.items():
        top[head] = dataclasses.replace(getattr(base, head), **changes)
    config = dataclasses.replace(base, **top)
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    """Semantic checks that types alone cannot express; the algorithm's own section checks itself."""
    if config.algo not in ALGORITHMS:
        close = difflib.get_close_matches(config.algo, list(ALGORITHMS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"unknown algo {config.algo!r}{hint}; available: {', '.join(sorted(ALGORITHMS))}")
    if config.mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    if config.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {config.device!r}")
    _at_least_1(config, "env.num_envs", "env.frame_stack", "farm.num_tasks", "farm.steps_per_env",
                "farm.keep_versions", "total_steps", "async.publish_interval", "eval.episodes", "eval.tasks")
    for key in ("farm.workers", "torch_threads"):
        if get(config, key) < 0:
            raise ConfigError(f"{key} must be at least 1, or 0 (\"auto\"), got {get(config, key)}")
    if config.farm.keep_versions < 2:
        raise ConfigError("farm.keep_versions must be at least 2 (the acting and the newest version)")
    if config.seed < 0:  # numpy seeds must be >= 0: a negative one would fail only on the workers
        raise ConfigError(f"seed must be a non-negative integer, got {config.seed}")
    if config.checkpoint_interval < 0:
        raise ConfigError("checkpoint_interval cannot be negative")
    for key in ("farm.task_timeout", "farm.lease_seconds", "farm.redis_outage_timeout", "farm.max_result_bytes"):
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
    policy = config.policy
    if policy.activation not in ("tanh", "relu"):
        raise ConfigError(f"policy.activation must be tanh or relu, got {policy.activation!r}")
    if not policy.hidden_sizes or min(policy.hidden_sizes) < 1:
        raise ConfigError("policy.hidden_sizes must be a non-empty list of positive sizes")
    cnn = (policy.cnn_channels, policy.cnn_kernels, policy.cnn_strides)
    if not policy.cnn_channels or len({len(x) for x in cnn}) != 1 or min(min(x) for x in cnn) < 1:
        raise ConfigError("policy.cnn_channels, policy.cnn_kernels and policy.cnn_strides must be lists of "
                          "positive integers of the same length (one entry per convolution)")
    _at_least_1(config, "policy.cnn_features")
    if not config.policy.normalize_clip > 0:
        raise ConfigError(f"policy.normalize_clip must be positive, got {config.policy.normalize_clip}")
    if config.eval.confirm_episodes < 0:
        raise ConfigError("eval.confirm_episodes cannot be negative (0: no confirmation)")
    if config.async_.max_policy_lag < 0 or config.eval.interval < 0:
        raise ConfigError("async.max_policy_lag and eval.interval cannot be negative")
    if config.async_.refresh_steps < 0:
        raise ConfigError("async.refresh_steps cannot be negative (0: a task acts with one version)")
    check_results_per_update(config, config.async_.tasks_in_flight)
    config.algo_config.check(config)
    if config.run_id and not all(c.isalnum() or c in "-_." for c in config.run_id):
        raise ConfigError(f"run_id may hold letters, digits, '-', '_' and '.', got {config.run_id!r}")


def check_results_per_update(config: RunConfig, tasks_in_flight: int) -> None:
    """A batch of more results than can ever be in flight would never fill (0 in flight: not known yet)."""
    k = config.async_.results_per_update
    if k < 0 or config.async_.tasks_in_flight < 0:
        raise ConfigError("async.results_per_update and async.tasks_in_flight cannot be negative")
    if k and tasks_in_flight and k > tasks_in_flight:
        raise ConfigError(f"async.results_per_update ({k}) is more than the tasks ever in flight "
                          f"({tasks_in_flight}): an update would never start; lower it, or raise "
                          f"async.tasks_in_flight")


def get(config: RunConfig, key: str) -> Any:
    obj: Any = config
    for part in key.split("."):
        obj = getattr(obj, _FIELD.get(part, part))
    return obj


def to_dict(config: RunConfig) -> dict[str, Any]:
    """Plain nested dict (tuples as lists): JSON- and msgpack-safe."""
    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v
    return {_USER.get(k, k): ({sk: plain(sv) for sk, sv in v.items()} if isinstance(v, dict) else plain(v))
            for k, v in dataclasses.asdict(config).items()}


def from_dict(tree: dict[str, Any]) -> RunConfig:
    """The inverse of `to_dict`, also of its JSON as `json_safe` wrote it: `target_return: null`
    (strict JSON has no Infinity) is the default, never stop early."""
    flat = flatten(tree)
    if "target_return" in flat and flat["target_return"] is None:
        del flat["target_return"]
    return from_flat(flat)


def json_safe(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, Infinity, -Infinity) replaced by None, recursively
    through dicts, lists and tuples: what `json.dumps(..., allow_nan=False)` accepts (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def policy_config(d: dict[str, Any]) -> PolicyConfig:
    """The [policy] section alone, e.g. from a saved policy's metadata, validated like a preset."""
    return from_flat(flatten({"policy": d})).policy


# ---- presets -------------------------------------------------------------------------------------

def _preset_dir() -> Path:
    return Path(str(resources.files("rlfarm") / "presets"))


def preset_names() -> list[str]:
    return sorted(p.stem for p in _preset_dir().glob("*.toml"))


def load_preset(name_or_path: str) -> dict[str, Any]:
    """A preset by shipped name or by path to a TOML file, as a flat dict of dotted keys."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" and path.exists()):
        path = _preset_dir() / f"{name_or_path}.toml"
        if not path.exists():
            names = preset_names()
            close = difflib.get_close_matches(name_or_path, names, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"unknown preset {name_or_path!r}{hint}; available: {', '.join(names)}")
    try:
        tree = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"preset {path}: invalid TOML: {exc}") from None
    return flatten(tree)


def parse_override(text: str) -> tuple[str, Any]:
    """'ppo.gamma=0.9' -> ('ppo.gamma', 0.9). Values are read as TOML, falling back to a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form key=value")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def build(preset: str | None = None, overrides: list[str] | tuple[str, ...] = (),
          **explicit: Any) -> RunConfig:
    """Preset, then `--set` overrides, then explicit CLI options (None values are skipped)."""
    values: dict[str, Any] = load_preset(preset) if preset else {}
    for text in overrides:
        key, value = parse_override(text)
        values[key] = value
    for key, value in explicit.items():
        if value is not None:
            values[key] = value
    return from_flat(values)


def preset_description(name: str) -> str:
    return str(load_preset(name).get("description", ""))

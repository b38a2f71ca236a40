"""Run configuration: frozen dataclasses, TOML presets and `key=value` overrides.

A run is described by one `RunConfig`. Presets are TOML files whose tables mirror the dataclasses
(`[env]`, `[farm]`, `[policy]`, `[ppo]`); overrides use dotted keys (`ppo.learning_rate=1e-3`).
Every algorithm brings its own section (`rlfarm/algos/<name>/config.py`): RunConfig has a field for
each one found there, so adding an algorithm changes nothing here. Everything here is pure: no Redis,
no Celery, no torch, no files except reading presets.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import math
import pkgutil
import tomllib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from rlfarm.config import length
from rlfarm.config.bounds import check_config_bounds
from rlfarm.config.errors import ConfigError
from rlfarm.config.section import FIELD as _FIELD
from rlfarm.config.section import AlgoSection, at_least_1, get

MODES = ("sync", "async")
DEVICES = ("auto", "cpu", "cuda")
# farm.compress: rlfarm.core.codec.COMPRESS_CHOICES, repeated here so reading a config never imports the
# codec (and torch with it); tests/test_wire.py checks the two agree.
COMPRESS = ("auto", "none", "zstd")
POLICY_DTYPES = ("float32", "float16")  # farm.policy_dtype: rlfarm.core.codec.wire_state
REFERENCES = ("", "sb3", "cleanrl")  # `reference`: Stable-Baselines3, CleanRL, or none


@dataclass(frozen=True)
class EnvConfig:
    id: str = "CartPole-v1"  # gymnasium id, or "module:callable" returning an Env
    num_envs: int = 4  # sub-environments stepped together inside one rollout task
    # Preprocessing, done on the workers: "auto" is DeepMind's Atari preprocessing for ALE ids
    # (rlfarm.envs.atari) and none for the rest; "atari" | "none" force it. The keys below are Atari's.
    preprocess: str = "auto"
    frame_stack: int = 4  # frames stacked into one observation
    screen_size: int = 84  # frames resized to this square (DeepMind's 84; 42: RLlib's APPO on Pong)
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
    # started gets one backup copy; queued tasks are never late (see rlfarm.farm.dispatch).
    task_timeout: float = 120.0
    max_redispatch: int = 3  # re-sends of one lost task after which the run fails instead of retrying
    keep_versions: int = 5  # policy versions retained in Redis
    lease_seconds: float = 10.0  # a running task's lease expiry: how soon a lost worker is noticed
    task_time_limit: float = 0.0  # hard limit on a task's run time on its worker; 0: 10x the longest seen
    redis_outage_timeout: float = 120.0  # seconds of Redis outage the trainer rides out before it stops
    max_result_bytes: int = 256 * 2**20  # a worker refuses to send a larger result (Redis caps at 512 MiB)
    # "fresh": every task starts its episodes anew (SYNC is bit-reproducible); "continue": each worker
    # process keeps its sub-envs running across tasks, so episodes may be longer than a task
    # (Atari, MuJoCo); not bit-reproducible (see rlfarm.core.rollout).
    episodes: str = "fresh"
    # Result arrays on the wire (rlfarm.core.codec): "auto" compresses large ones (zstd; Atari frame stacks
    # shrink by two orders of magnitude, benchmarks/wire.py), "zstd" pins that codec, "none" sends them
    # raw. max_result_bytes is the compressed size.
    compress: str = "auto"
    # This run's weight in the farm's task slots among the runs training on it at once (`--share W`):
    # slots are split in proportion to the weights of the runs that want them (rlfarm.core.shares).
    share: float = 1.0
    # Policy versions in Redis: "float32", or "float16" to halve what each fetch sends for large networks
    # (the Nature CNN: 6.75 MB -> 3.4). Workers act in float32 with the rounded weights; the learner,
    # its checkpoints and final_policy.safetensors keep float32 (tests/test_machine.py compares acting).
    policy_dtype: str = "float32"


@dataclass(frozen=True)
class PolicyConfig:
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP layers (vector observations)
    activation: str = "tanh"  # tanh | relu
    init_log_std: float = 0.0  # Gaussian policies: initial log standard deviation
    # Image observations: a Nature-CNN encoder (Mnih et al. 2015). Images too small for these
    # kernels get a small 3x3 encoder instead (rlfarm.nn.layers.cnn_layers says which).
    cnn_channels: tuple[int, ...] = (32, 64, 64)
    cnn_kernels: tuple[int, ...] = (8, 4, 3)
    cnn_strides: tuple[int, ...] = (4, 2, 1)
    cnn_features: int = 512  # the encoder's output size (a linear layer after the convolutions)
    # Vector observations: normalise by running mean and variance, kept in the network's state (so
    # every version carries the statistics it acts with) and updated by the learner (rlfarm.nn.normalize).
    normalize_obs: bool = False
    normalize_clip: float = 10.0  # normalised observations are clipped to [-clip, clip]
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
    # longer than an update, most steps then act with the newest version: APPO needed fewer env steps
    # and less time (benchmarks/appo.py, sleep-bound env).
    refresh_steps: int = 64


@dataclass(frozen=True)
class EvalConfig:
    interval: int = 0  # env steps between greedy evaluations (0: never)
    episodes: int = 10  # episodes per evaluation, split over `tasks` tasks
    tasks: int = 2
    # An evaluation at or above target_return is confirmed by this many more greedy episodes with
    # other seeds before the run counts the target as reached (0: the first evaluation decides).
    confirm_episodes: int = 20


def _algorithm_sections() -> dict[str, type[AlgoSection]]:
    """Every algorithm's section, by name, from the packages under rlfarm/algos/ (each one's
    `config.py`; importing it imports no torch). Their order is the packages' (alphabetical)."""
    found: dict[str, type[AlgoSection]] = {}
    spec = importlib.util.find_spec("rlfarm.algos")
    for info in pkgutil.iter_modules(spec.submodule_search_locations if spec else []):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"rlfarm.algos.{info.name}.config")
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, AlgoSection) and value.__module__ == module.__name__
                    and "algo" in vars(value)):
                found[value.algo] = value
    return found


# Every algorithm's section, by name: what a config can name (rlfarm.algos.learner finds the learners
# from the same sections).
ALGORITHMS: dict[str, type[AlgoSection]] = _algorithm_sections()


class _RunConfigBase:
    """RunConfig's methods (the fields are made from the algorithms found, below)."""

    algo: str
    mode: str
    total_steps: int

    @property
    def algo_config(self) -> AlgoSection:
        """The section of this run's algorithm (cfg.ppo for algo "ppo")."""
        return getattr(self, ALGORITHMS[self.algo].algo)

    @property
    def steps_per_iteration(self) -> int:
        return self.farm.num_tasks * self.env.num_envs * self.farm.steps_per_env  # type: ignore[attr-defined]

    @property
    def num_iterations(self) -> int:
        return length.num_iterations(self)

    def task_steps(self, env_steps: int) -> int:
        """Steps per env of a SYNC iteration starting at `env_steps` (the last one's are fewer)."""
        return length.task_steps(self, env_steps)

    def rounding_note(self) -> str | None:
        return length.rounding_note(self)


RunConfig = dataclasses.make_dataclass("RunConfig", [
    ("description", str, field(default="")),
    ("algo", str, field(default="ppo")),
    ("mode", str, field(default="sync")),
    ("seed", int, field(default=1)),
    ("total_steps", int, field(default=100_000)),
    ("target_return", float, field(default=math.inf)),  # stop early once the mean of the last 20 episodes reaches it
    # The implementation whose update this config's matches, "sb3" (Stable-Baselines3) or "cleanrl",
    # on the same batch and weights (tests/test_reference.py checks every shipped SYNC PPO preset that
    # way); "" for none. It changes nothing in a run: it says what the hyper-parameters may be compared to.
    ("reference", str, field(default="")),
    ("device", str, field(default="auto")),
    ("run_id", str, field(default="")),  # empty: generated at start
    ("logdir", str, field(default="runs")),
    # Trainer threads; 0 ("auto", rlfarm.config.cores): one for MLPs (fastest and reproducible at
    # their sizes), for CNNs what the learner's share of the cores is.
    ("torch_threads", int, field(default=0)),
    # Trainer checkpoint (for --resume) at most every this many seconds, at a published version, and
    # at the end; 0: at every published version. Off-policy replay buffers are saved with it when
    # checkpoint_replay.
    ("checkpoint_interval", float, field(default=10.0)),
    ("checkpoint_replay", bool, field(default=True)),
    ("env", EnvConfig, field(default_factory=EnvConfig)),
    ("farm", FarmConfig, field(default_factory=FarmConfig)),
    ("policy", PolicyConfig, field(default_factory=PolicyConfig)),
    *((name, section, field(default_factory=section)) for name, section in ALGORITHMS.items()),
    ("async_", AsyncConfig, field(default_factory=AsyncConfig)),
    ("eval", EvalConfig, field(default_factory=EvalConfig)),
], bases=(_RunConfigBase,), frozen=True)
RunConfig.__module__ = __name__
RunConfig.__doc__ = """One run's whole configuration: top-level keys, then one frozen section per table
([env], [farm], [policy], one per algorithm, [async], [eval])."""


_USER = {v: k for k, v in _FIELD.items()}


def _hints(cls: type) -> dict[str, Any]:
    """A dataclass's fields and their types (its ClassVars are not keys)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


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
    if config.reference not in REFERENCES:
        raise ConfigError(f"reference must be sb3, cleanrl or \"\" (none), got {config.reference!r}")
    if config.device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}, got {config.device!r}")
    at_least_1(config, "env.num_envs", "env.frame_stack", "env.screen_size", "farm.num_tasks", "farm.steps_per_env",
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
    for key in ("farm.task_timeout", "farm.lease_seconds", "farm.redis_outage_timeout", "farm.max_result_bytes",
                "farm.share"):
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
        raise ConfigError(f"farm.policy_dtype must be one of {', '.join(POLICY_DTYPES)}, got "
                          f"{config.farm.policy_dtype!r}")
    policy = config.policy
    if policy.activation not in ("tanh", "relu"):
        raise ConfigError(f"policy.activation must be tanh or relu, got {policy.activation!r}")
    if not policy.hidden_sizes or min(policy.hidden_sizes) < 1:
        raise ConfigError("policy.hidden_sizes must be a non-empty list of positive sizes")
    cnn = (policy.cnn_channels, policy.cnn_kernels, policy.cnn_strides)
    if not policy.cnn_channels or len({len(x) for x in cnn}) != 1 or min(min(x) for x in cnn) < 1:
        raise ConfigError("policy.cnn_channels, policy.cnn_kernels and policy.cnn_strides must be lists of "
                          "positive integers of the same length (one entry per convolution)")
    at_least_1(config, "policy.cnn_features")
    if not config.policy.normalize_clip > 0:
        raise ConfigError(f"policy.normalize_clip must be positive, got {config.policy.normalize_clip}")
    if config.eval.confirm_episodes < 0:
        raise ConfigError("eval.confirm_episodes cannot be negative (0: no confirmation)")
    if config.async_.max_policy_lag < 0 or config.eval.interval < 0:
        raise ConfigError("async.max_policy_lag and eval.interval cannot be negative")
    if config.async_.refresh_steps < 0:
        raise ConfigError("async.refresh_steps cannot be negative (0: a task acts with one version)")
    check_results_per_update(config, config.async_.tasks_in_flight)
    check_config_bounds(config)  # after the lower bounds, so a 0 is not reported as a bound
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
def to_dict(config: RunConfig) -> dict[str, Any]:
    """Plain nested dict (tuples as lists): JSON- and msgpack-safe. Of the algorithms' sections only
    the run's own: the run metadata workers read then does not change when an algorithm is added, so
    a worker of an older release still reads the runs of the algorithms it knows."""
    def plain(v: Any) -> Any:
        return list(v) if isinstance(v, tuple) else v
    return {_USER.get(k, k): ({sk: plain(sv) for sk, sv in v.items()} if isinstance(v, dict) else plain(v))
            for k, v in dataclasses.asdict(config).items() if k not in ALGORITHMS or k == config.algo}


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
    return Path(str(resources.files("rlfarm.config") / "presets"))


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

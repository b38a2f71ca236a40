"""rlfarm as a library: train from a script or a notebook, as the `rlfarm train` command does.

    import rlfarm

    result = rlfarm.train("cartpole-dqn", seed=3, overrides={"dqn.learning_rate": 5e-4})
    result.best_policy, result.final_policy, result.run_dir

    def stop_early(step: rlfarm.LogStep) -> bool | None:
        step.extra["my/ratio"] = step.metrics["charts/SPS"] / 1000   # logged as custom/my/ratio
        return step.env_steps < 20_000                               # False stops the run

    rlfarm.train("cartpole-ppo", callback=stop_early, redis_url="redis://:pw@farm-host:6379/0")

Without `redis_url`, the local farm of `rlfarm up` if one is up, else an embedded Redis and `workers`
local worker processes, started for the run and stopped after it, whatever happens. Errors are
exceptions (ConfigError for bad input, EnvError, ConnectionError for an unreachable Redis,
RolloutError and TaskLostError for failed tasks, RedisUnavailable after an outage past its limit);
the CLI turns each into one line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rlfarm import config as C
from rlfarm.errors import RunExists

log = logging.getLogger("rlfarm")

# Keyword options of `make_config` and `train` and the config keys they set (the rest pass through as
# dotted keys with "__" for ".", e.g. ppo__learning_rate=1e-3).
_OPTION_KEYS = {"env": "env.id", "workers": "farm.workers"}
FORK_WORKERS_ENV = "RLFARM_FORK_WORKERS"  # "0": the embedded workers start from fresh interpreters


def config_values(
    preset: str | None = "cartpole-ppo", overrides: Mapping[str, Any] | Iterable[str] | None = None, **options: Any
) -> dict[str, Any]:
    """The flat values (dotted keys) a config is made of, in order: the preset's (a shipped name or a
    TOML file; None: only the defaults), then `overrides` ({"ppo.gamma": 0.98} or ["ppo.gamma=0.98"]),
    then keyword options (None values skipped; see make_config). A sweep keeps them as they are: its
    trials and best.toml start from them."""
    values: dict[str, Any] = C.load_preset(preset) if preset else {}
    if isinstance(overrides, Mapping):
        values.update(overrides)
    else:
        for text in overrides or ():
            key, value = C.parse_override(text)
            values[key] = value
    for name, value in options.items():
        if value is not None:
            values[_OPTION_KEYS.get(name, name.replace("__", "."))] = value
    return values


def make_config(
    preset: str | None = "cartpole-ppo",
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    *,
    base: C.RunConfig | None = None,
    **options: Any,
) -> C.RunConfig:
    """A validated RunConfig, made the one way every config is (`rlfarm train`, `--seeds`, `--resume`,
    `rlfarm sweep` and this API): the preset's values (config_values), or `base`'s (a RunConfig; give
    preset None), then overrides, then keyword options (total_steps=..., seed=..., env="Acrobot-v1",
    mode="async", workers=4, or any config key with "__" for ".": farm__share=2)."""
    return C.from_flat(config_values(preset, overrides, **options), base)


def check_config(cfg: C.RunConfig) -> None:
    """What can be checked before anything starts: mode and algorithm, the env and its spaces, CUDA."""
    from rlfarm.algos import check_env, check_mode
    from rlfarm.envs import describe

    check_mode(cfg.algo, cfg.mode)
    spec = describe(cfg.env.id, dataclasses.asdict(cfg.env))
    check_env(cfg.algo, spec)
    if spec.agents > 1:
        C.check_agents(cfg, spec.agents)
    check_game_settings(cfg, spec)
    C.check_replay_memory(
        cfg, spec.obs_shape, spec.obs_dtype == "uint8", 1 if spec.discrete else spec.action_dim, C.machine_memory()
    )
    if cfg.farm.episodes == "continue":
        from rlfarm.envs import snapshot

        snapshot.check(cfg.env.id, dataclasses.asdict(cfg.env), agents=spec.agents)
    if cfg.device == "cuda":
        from rlfarm.trainer import resolve_device

        resolve_device(cfg.device)


def check_game_settings(cfg: C.RunConfig, spec: Any) -> None:
    """Settings of multi-agent envs and turn-based games on an env that has neither were ignored in
    silence, and a scripted opponent the game lacks failed on the worker after the run had started."""
    sp = cfg.selfplay
    if spec.seats > 1:
        from rlfarm.envs.opponents import scripted

        used = {sp.eval_opponent} | ({sp.opponents} - {"league"}) | ({sp.scripted} if sp.scripted_share else set())
        for name in sorted(used):
            scripted(name, cfg.env.id)  # EnvError: this game has no such player
    elif sp != C.RunConfig().selfplay:
        raise C.ConfigError(
            f"selfplay.* settings are for turn-based games; env {cfg.env.id!r} has one player (leave [selfplay] out)"
        )
    if cfg.env.policy_map and not spec.policies:
        raise C.ConfigError(f"env.policy_map is for multi-agent envs; env {cfg.env.id!r} has one agent (leave it out)")


def embedded_in_flight(cfg: C.RunConfig) -> int:
    """ASYNC tasks in flight on the embedded default: one per local worker process, at least 2, so a
    lone worker finds its next task queued when it finishes one instead of waiting for the trainer."""
    return max(2, C.local_workers(cfg))


def with_run_id(cfg: C.RunConfig) -> C.RunConfig:
    """The config with a generated run id (`<env>-<date>-<time>-<4 hex>`) when it has none."""
    if cfg.run_id:
        return cfg
    name = cfg.env.id.split(":")[-1].split("/")[-1].lower()
    return C.from_flat({"run_id": f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"}, cfg)


def run_length_notes(cfg: C.RunConfig) -> list[tuple[int, str]]:
    """(logging level, line) about how long the run and its episodes really are, before it starts: SYNC
    total_steps that end in a shorter iteration, and an env whose episodes outlast a task (every task
    starts fresh episodes, so training returns only count episodes that end within one). The latter
    is a warning only when the training return is the run's score: greedy evaluations play whole
    episodes, so a run that evaluates (cartpole-dqn: 256-step tasks on purpose) is told it with -v."""
    from rlfarm.envs import episode_limit
    from rlfarm.errors import EnvError

    notes = [(logging.INFO, note) for note in [cfg.rounding_note()] if note]
    try:
        limit = episode_limit(cfg.env.id)
    except EnvError:
        limit = None  # unknown: no warning (the env was already built once; the trainer says more)
    steps = cfg.farm.steps_per_env
    if limit is not None and limit > steps and cfg.farm.episodes == "fresh":
        capped = (
            f"{cfg.env.id} episodes last up to {limit} steps but each task runs {steps} steps per env "
            f"and starts fresh episodes: training returns only count episodes that end within a task "
            f"(at most {steps} steps)"
        )
        if cfg.eval.interval:  # shown with -v only: it was four lines on every cartpole-dqn run (issue 51)
            notes.append(
                (
                    logging.DEBUG,
                    f"{capped}, and act with exploration; greedy evaluations play whole "
                    f"episodes and are the run's score",
                )
            )
        else:
            notes.append(
                (
                    logging.WARNING,
                    f"{capped}; --set farm.episodes=continue keeps each worker's envs running across tasks",
                )
            )
    return notes


def check_new_run(cfg: C.RunConfig) -> None:
    """RunExists when the run directory of `cfg` (with its run id) already holds a run."""
    run_dir = Path(cfg.logdir) / cfg.run_id
    if (run_dir / "config.json").exists():
        raise RunExists(cfg.run_id, run_dir)


def resume_config(run: str, logdir: str | None = None, **changes: Any) -> C.RunConfig:
    """The config of a run to resume, from its run directory (a path, or a run id under `logdir`),
    with the few changes a resume allows, as make_config's options (total_steps, target_return,
    workers, device, farm__share)."""
    from rlfarm.trainer import resume as checkpoint

    run_dir = Path(run)
    if not (run_dir / "config.json").is_file():
        run_dir = Path(logdir or C.RunConfig.logdir) / run
    if not (run_dir / "config.json").is_file():
        raise C.ConfigError(f"no run {run!r}: neither {run} nor {run_dir} is a run directory (one with config.json)")
    if not checkpoint.path_in(run_dir).is_file():
        raise C.ConfigError(f"run directory {run_dir} has no trainer checkpoint ({checkpoint.FILENAME}) to resume from")
    cfg = C.from_dict(json.loads((run_dir / "config.json").read_text()))
    if cfg.run_id != run_dir.name:
        raise C.ConfigError(f"{run_dir} holds run {cfg.run_id!r}; a run directory is named after its run")
    return make_config(None, base=cfg, **changes, logdir=str(run_dir.parent))


def online_processes(redis_url: str) -> int:
    """Worker processes currently consuming from this Redis (Celery inspect), 0 if none answer."""
    from rlfarm.farm.app import make_app

    app = make_app(redis_url)
    try:
        stats = app.control.inspect(timeout=1.0).stats() or {}
    finally:
        app.close()
    return sum(int(s.get("pool", {}).get("max-concurrency", 0)) for s in stats.values())


def run(
    cfg: C.RunConfig,
    redis_url: str | None = None,
    resume: bool = False,
    callback: Callable[..., bool | None] | None = None,
    console: Any = None,
    notify: Callable[[str], None] | None = None,
    metrics: tuple[str, int] | None = None,
    farm: Any = None,
    capture_video: bool = False,
    tracking: Any = None,
):
    """Train `cfg` (already checked, with a run id) on the farm at `redis_url`, or on an embedded one.
    `farm`: the farm found already (rlfarm.farm.find.Farm; the CLI's); default: the one `redis_url`
    names, else the `rlfarm up` farm, else none (the embedded default). The up farm's secret signs the
    run's data in Redis however its URL was given. `notify(text)`: where start-up notes go (default:
    the "rlfarm" logger). `metrics`: (host, port) to serve the run's Prometheus metrics on while it
    trains (rlfarm.runio.exporter). `capture_video`, `tracking`: see `train` (checked already:
    rlfarm.observe.video.check, rlfarm.observe.tracking.check)."""
    from rlfarm.farm.connection import connect, redact, refuse_eviction
    from rlfarm.farm.find import UP_FARM, find_farm, secret_mismatch

    notify = notify or log.info
    run_dir = Path(cfg.logdir) / cfg.run_id
    options = {
        "resume": resume,
        "callback": callback,
        "console": console,
        "capture_video": capture_video,
        "tracking": tracking,
    }
    processes = None
    if farm is None:
        farm = find_farm(redis_url, environ={})  # the API reads no RLFARM_REDIS_URL: redis_url is given or not
    redis_url = farm.url
    if farm.secret:  # its workers hold it (rlfarm.local.farm.up)
        options["secret"] = farm.secret
        mismatch = secret_mismatch(farm)
        if mismatch:
            log.warning("%s", mismatch)
    if farm.up:
        processes = farm.local_workers  # no need to ask the workers
        options["local_workers"] = processes  # on this machine: the trainer's threads leave them their cores
        if farm.source == UP_FARM:
            notify(
                f"no --redis given: training on the local farm started by `rlfarm up` ({processes} "
                f"worker process{'es' if processes != 1 else ''}; `rlfarm down` stops it)"
            )
        else:
            notify(f"farm: {farm.source}; training on it with the secret its workers hold")
    if redis_url:
        probe = connect(redis_url)  # ConnectionError (RedisAuthError: credentials) before anything else
        try:
            refuse_eviction(probe, redis_url)
        finally:
            probe.close()
        if processes is None:
            processes = online_processes(redis_url)  # a broadcast that waits 1 s for answers
        if not processes:
            notify(
                f"no worker answered on {redact(redis_url)}; tasks wait in the queue until one starts "
                f"(`rlfarm worker --redis URL`)"
            )
        from rlfarm.farm.claim import RunDirLock
        from rlfarm.trainer import make_trainer

        trainer = make_trainer(cfg, redis_url, run_dir, tasks_in_flight=max(2, processes), **options)
        with RunDirLock(run_dir):  # RunInUse: another trainer writes this directory
            return _train_serving(trainer, metrics, notify)

    from rlfarm.core.signing import SECRET_ENV, secret_from_env
    from rlfarm.envs import allowed_modules_env
    from rlfarm.farm.claim import RunDirLock
    from rlfarm.farm.find import register_embedded
    from rlfarm.local.cluster import LocalCluster
    from rlfarm.runio.rundir import write_atomic

    lock = RunDirLock(run_dir)  # before anything is written into the directory (the farm's logs)
    lock.acquire()
    workers = C.local_workers(cfg)
    notify(
        f"no --redis given: starting an embedded Redis and a local worker of {workers} rollout "
        f"process{'es' * (workers != 1)} "
        f"(logs in {run_dir}/)"  # plus the worker's main process: `ps` shows one more
    )
    # The user's own `module:callable` env is trusted on the user's own local workers.
    extra_env = allowed_modules_env(cfg.env.id)
    if not secret_from_env():
        # Signed by default: without a secret, anyone who can reach this Redis (any local user) could
        # push a forged result that counts as the task's first copy. Made per run, given to its
        # workers through their environment, never written down.
        options["secret"] = extra_env[SECRET_ENV] = secrets.token_hex(32)
    # torch first, then the workers forked from this process with it (rlfarm.local.forked.ForkedWorker):
    # one import of it for the trainer and its workers instead of one each. RLFARM_FORK_WORKERS=0
    # starts them from fresh interpreters instead, as before (and as benchmarks/startup.py compares).
    from rlfarm.trainer import make_trainer

    fork = os.environ.get(FORK_WORKERS_ENV, "1").strip() != "0"
    cluster = LocalCluster(
        workers=workers, name=f"rlfarm-{cfg.run_id}", log_dir=run_dir, extra_env=extra_env, fork_workers=fork
    )
    registered = None
    try:
        cluster.start(wait=False)  # the workers start while the trainer builds its network
        # Atomic: `rlfarm status` and tests read it while the run starts (a half-written file is no JSON).
        write_atomic(
            run_dir / "cluster.json", json.dumps({"redis_url": cluster.redis_url, "pids": cluster.pids}) + "\n"
        )
        registered = register_embedded(run_dir)  # `rlfarm status` finds this run's Redis by it
        trainer = make_trainer(
            cfg, cluster.redis_url, run_dir, tasks_in_flight=embedded_in_flight(cfg), local_workers=workers, **options
        )
        cluster.wait_ready()
        return _train_serving(trainer, metrics, notify)
    finally:
        if registered is not None:
            registered.unlink(missing_ok=True)
        cluster.stop()
        lock.release()


def _train_serving(trainer: Any, metrics: tuple[str, int] | None, notify: Callable[[str], None]):
    """trainer.train(), with its Prometheus metrics served meanwhile when `metrics` is (host, port)."""
    if metrics is None:
        return trainer.train()
    from rlfarm.runio import exporter

    served = exporter.serve(
        exporter.LiveCollector(
            "trainer", exporter.TRAINER_METRICS, "run", trainer.heartbeats.labels, trainer.live_metrics
        ),
        *metrics,
    )
    notify(f"Prometheus metrics of run {trainer.config.run_id} at {served.url}")
    try:
        return trainer.train()
    finally:
        served.close()


def train(
    preset: str | None = "cartpole-ppo",
    *,
    config: C.RunConfig | None = None,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    redis_url: str | None = None,
    callback: Callable[..., bool | None] | None = None,
    console: Any = None,
    capture_video: bool = False,
    track: bool | str = False,
    **options: Any,
):
    """Train and return a `TrainResult` (run_dir, final_policy, best_policy, returns, counters).

    `preset`: a shipped preset name or a TOML path; `config`: a RunConfig instead (then `overrides`
    and `options` apply on top of it). `redis_url`: a farm's Redis (None: the `rlfarm up` farm if
    one is up, else an embedded Redis and `workers` local worker processes). `callback(LogStep)`:
    after each log step; return False to stop. `capture_video`: record a greedy episode of each
    evaluation to RUN_DIR/videos/ (moviepy). `track`: log the run to MLflow, True for
    MLFLOW_TRACKING_URI or ./mlruns, or a tracking URI (rlfarm.observe.tracking).
    `options`: total_steps, seed, target_return, env, mode, workers, run_id, logdir, device, or any
    dotted config key with "__" for "." (ppo__learning_rate=1e-3).
    """
    if not logging.getLogger("rlfarm").handlers:  # a script or notebook that set up no logging
        from rlfarm.runio.logs import setup_logging

        setup_logging(0)
    cfg = make_config(preset if config is None else None, overrides, base=config, **options)
    from rlfarm.farm.find import find_farm

    farm = find_farm(redis_url, environ={})
    check_config(cfg)
    tracking = check_extras(cfg, capture_video, track or None)
    cfg = with_run_id(cfg)
    check_new_run(cfg)
    return run(
        cfg,
        redis_url=farm.url,
        callback=callback,
        console=console,
        farm=farm,
        capture_video=capture_video,
        tracking=tracking,
    )


def check_extras(
    cfg: C.RunConfig, capture_video: bool = False, track: bool | str | None = None, experiment: str | None = None
) -> Any:
    """--capture-video and --track checked before anything starts (VideoError, TrackingError: both
    ConfigErrors); returns the run's Tracking, or None. `track`: True, or a tracking URI."""
    if capture_video:
        from rlfarm.observe import video

        video.check(cfg)
        if not cfg.eval.interval:
            log.warning(
                "--capture-video records the greedy evaluations, and eval.interval = 0 schedules "
                "none: --set eval.interval=N for a video every N env steps"
            )
    if not track and experiment is None:
        return None
    from rlfarm.observe import tracking

    where = tracking.Tracking.resolve(track if isinstance(track, str) else None, experiment)
    tracking.check(where)
    return where

"""`rlfarm`: train on a Celery + Redis rollout farm, run workers, evaluate and inspect policies."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from pathlib import Path

import click

REDIS_HELP = "Redis URL of the farm (broker, results and policy store); env RLFARM_REDIS_URL."


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    click.echo(f"rlfarm: error: {message}", err=True)
    sys.exit(code)


class PolicyVersion(click.ParamType):
    """A stored policy version: a non-negative integer, or 'latest'. Anything else is a usage error
    (one `rlfarm: error:` line, exit 2), before Redis is contacted."""

    name = "version"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N|latest"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        text = str(value).strip()
        if text == "latest":
            return text
        if text.isascii() and text.isdigit():
            return int(text)
        flag = param.opts[0] if param is not None and param.opts else "version"
        fail(f"{flag} must be a non-negative integer or 'latest', got {value!r}")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rlfarm")
def main() -> None:
    """rlfarm: RL rollout episodes as Celery tasks on any number of machines, Redis in the middle.

    Start with `rlfarm train` (no Redis running? it starts an embedded one and local workers),
    add machines with `rlfarm worker --redis URL`.
    """


def _sigterm_to_interrupt() -> None:
    """SIGTERM and SIGINT both stop a run cleanly (workers and embedded Redis stopped, exit 130).

    SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


@main.command()
@click.option("--preset", default="cartpole-ppo", show_default=True,
              help="Preset name (see `rlfarm presets`) or path to a TOML file.")
@click.option("--env", "env_id", help="Gymnasium env id or 'module:callable' (overrides the preset).")
@click.option("--mode", type=click.Choice(["sync", "async"]), help="SYNC waits for whole groups (on-policy).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set ppo.learning_rate=1e-3 (repeatable).")
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL",
              help=REDIS_HELP + " Omitted: an embedded Redis and local workers are started.")
@click.option("--workers", type=click.IntRange(min=1), help="Worker processes for the embedded default.")
@click.option("--total-steps", type=click.IntRange(min=1), help="Env steps to train for.")
@click.option("--target-return", type=float,
              help="Stop early once the mean return of the last 20 episodes reaches this.")
@click.option("--seed", type=int, help="Run seed: same seed, same policy, whatever the worker count.")
@click.option("--run-id", help="Name of the run in Redis and under --logdir (default: generated).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Trainer device (workers: CPU).")
@click.option("--logdir", type=click.Path(file_okay=False), help="Parent of the run directory [runs].")
@click.option("--resume", "resume", metavar="RUN",
              help="Continue a run whose trainer died, from its checkpoint: a run directory, or a run id "
                   "under --logdir. Takes the run's own config; --total-steps, --target-return, "
                   "--workers, --device and --redis may change.")
@click.option("--if-exists", type=click.Choice(["error", "resume"]), default="error", show_default=True,
              help="When --run-id names a run that already has a checkpoint under --logdir: refuse, or "
                   "resume it (what a restarted trainer service wants).")
@click.pass_context
def train(ctx: click.Context, preset: str, env_id: str | None, mode: str | None,
          overrides: tuple[str, ...], redis_url: str | None, workers: int | None,
          total_steps: int | None, target_return: float | None, seed: int | None,
          run_id: str | None, device: str | None, logdir: str | None, resume: str | None,
          if_exists: str) -> None:
    """Train a policy on the farm and save it under LOGDIR/RUN_ID.

    Writes config.json, progress.csv, episodes.csv, TensorBoard scalars, a trainer checkpoint (for
    --resume) and final_policy.safetensors.
    """
    from rlfarm import checkpoint
    from rlfarm import config as C
    from rlfarm.algos import check_env, check_mode
    from rlfarm.envs import EnvError, describe

    auto_resume = False
    if not resume and run_id and if_exists == "resume":
        existing = Path(logdir or C.RunConfig.logdir) / run_id
        if checkpoint.path_in(existing).is_file():
            click.echo(f"rlfarm: run {run_id} already exists in {existing.parent}/: resuming it "
                       f"with its own config (--if-exists resume)", err=True)
            resume, auto_resume = run_id, True
    try:
        if resume and not auto_resume:
            fixed = [name for name in ("preset", "env_id", "mode", "overrides", "seed", "run_id")
                     if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
            if fixed:
                flags = {"preset": "--preset", "env_id": "--env", "mode": "--mode", "overrides": "--set",
                         "seed": "--seed", "run_id": "--run-id"}
                opts = ", ".join(flags[n] for n in fixed)
                raise C.ConfigError(f"--resume continues a run with its own config; {opts} cannot change it")
        if resume:
            cfg = _resume_config(resume, logdir, {
                "farm.workers": workers, "total_steps": total_steps, "target_return": target_return,
                "device": device})
        else:
            cfg = C.build(preset, overrides, **{
                "env.id": env_id, "mode": mode, "farm.workers": workers, "total_steps": total_steps,
                "target_return": target_return, "seed": seed, "run_id": run_id, "device": device,
                "logdir": logdir})
        check_mode(cfg.algo, cfg.mode)
        check_env(cfg.algo, describe(cfg.env.id).discrete)
        if cfg.device == "cuda":
            from rlfarm.trainer import resolve_device

            resolve_device(cfg.device)
    except (C.ConfigError, EnvError) as exc:
        fail(str(exc))
    if not cfg.run_id:
        name = cfg.env.id.split(":")[-1].split("/")[-1].lower()
        cfg = C.from_flat({"run_id": f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"}, cfg)
    run_dir = Path(cfg.logdir) / cfg.run_id
    if not resume and (run_dir / "config.json").exists():
        fail(f"run {cfg.run_id} already exists in {run_dir.parent}/; continue it with --resume "
             f"{cfg.run_id}, or choose another --run-id")
    _sigterm_to_interrupt()
    try:
        if redis_url:
            result = _train_on(cfg, redis_url, run_dir, resume=bool(resume))
        else:
            result = _train_embedded(cfg, run_dir, resume=bool(resume))
    except KeyboardInterrupt:
        if not redis_url:  # only the embedded default owns (and has now stopped) its workers and Redis
            click.echo("rlfarm: interrupted; workers and Redis stopped", err=True)
        else:
            click.echo(_interrupted_on_redis(ctx, cfg, run_dir, redis_url), err=True)
        sys.exit(130)
    evaluated = "" if result.eval_mean_return != result.eval_mean_return else (
        f", greedy evaluation of the final policy {result.eval_mean_return:.1f} "
        f"(best {result.best_eval_mean_return:.1f})")
    click.echo(f"run {result.run_id}: {result.env_steps} env steps in {result.wall_seconds:.1f} s, "
               f"policy v{result.final_version}, mean return of the last 20 episodes "
               f"{result.rolling_return:.1f} (best {result.best_rolling_return:.1f}){evaluated}")
    click.echo(f"saved to {run_dir}/ (final_policy.safetensors sha256 {result.policy_sha256[:16]})")


def _interrupted_on_redis(ctx: click.Context, cfg, run_dir: Path, redis_url: str) -> str:
    """The line for a run on a farm (--redis) stopped by Ctrl-C: its workers and Redis are not this
    process's and keep running; say how to continue the run from its checkpoint."""
    import shlex

    from rlfarm import checkpoint
    from rlfarm.config import RunConfig
    from rlfarm.store import redact

    if not checkpoint.path_in(run_dir).is_file():
        return (f"rlfarm: interrupted before run {cfg.run_id} saved its first checkpoint, nothing to "
                f"resume; to start it again under that id, remove {run_dir}/ and run "
                f"`rlfarm checkpoints delete {cfg.run_id}`")
    command = f"rlfarm train --resume {cfg.run_id}"
    if Path(cfg.logdir) != Path(RunConfig.logdir):
        command += f" --logdir {shlex.quote(cfg.logdir)}"
    if ctx.get_parameter_source("redis_url") is not click.core.ParameterSource.ENVIRONMENT:
        command += f" --redis {shlex.quote(redact(redis_url))}"  # password masked: retype it
    return f"rlfarm: interrupted; run {cfg.run_id} can continue with: {command}"


def _resume_config(run: str, logdir: str | None, changes: dict):
    """The config of the run to resume (from its run directory), with the few allowed changes."""
    import json

    from rlfarm import checkpoint
    from rlfarm import config as C

    run_dir = Path(run)
    if not (run_dir / "config.json").is_file():
        run_dir = Path(logdir or C.RunConfig.logdir) / run
    if not (run_dir / "config.json").is_file():
        raise C.ConfigError(f"no run {run!r}: neither {run} nor {run_dir} is a run directory "
                            f"(one with config.json)")
    if not checkpoint.path_in(run_dir).is_file():
        raise C.ConfigError(f"run directory {run_dir} has no trainer checkpoint "
                            f"({checkpoint.FILENAME}) to resume from")
    cfg = C.from_dict(json.loads((run_dir / "config.json").read_text()))
    if cfg.run_id != run_dir.name:
        raise C.ConfigError(f"{run_dir} holds run {cfg.run_id!r}; a run directory is named after its run")
    changes = {k: v for k, v in changes.items() if v is not None}
    return C.from_flat({**changes, "logdir": str(run_dir.parent)}, cfg)


def _online_processes(redis_url: str) -> int:
    """Worker processes currently consuming from this Redis (Celery inspect), 0 if none answer."""
    from rlfarm.celery_app import make_app

    stats = make_app(redis_url).control.inspect(timeout=1.0).stats() or {}
    return sum(int(s.get("pool", {}).get("max-concurrency", 0)) for s in stats.values())


def _train_on(cfg, redis_url: str, run_dir: Path, cluster=None, resume: bool = False):
    from rlfarm.checkpoint import CheckpointError
    from rlfarm.config import ConfigError
    from rlfarm.dispatch import RolloutError, TaskLostError
    from rlfarm.outage import RedisUnavailable, is_oom
    from rlfarm.store import RedisAuthError, connect, redact
    from rlfarm.trainer import make_trainer

    try:
        connect(redis_url).close()
    except ConnectionError as exc:  # wrong credentials are a usage error (2), like a bad option
        fail(str(exc), 2 if isinstance(exc, RedisAuthError) else 1)
    try:
        if cluster is not None:
            trainer = make_trainer(cfg, redis_url, run_dir, tasks_in_flight=cfg.farm.workers, resume=resume)
            cluster.wait_ready()  # its workers started while the trainer was being built
        else:
            processes = _online_processes(redis_url)
            if not processes:
                click.echo(f"rlfarm: no worker answered on {redact(redis_url)}; tasks wait in the queue "
                           f"until one starts (`rlfarm worker --redis URL`)", err=True)
            trainer = make_trainer(cfg, redis_url, run_dir, tasks_in_flight=max(2, processes), resume=resume)
        return trainer.train()
    except (ConfigError, CheckpointError) as exc:
        fail(str(exc))
    except (RolloutError, TaskLostError) as exc:
        fail(str(exc), 1)
    except RedisUnavailable as exc:
        fail(f"{exc}; the run can continue once Redis is back: rlfarm train --resume {cfg.run_id}", 1)
    except Exception as exc:  # noqa: BLE001 - only Redis refusing writes is turned into one line here
        if not is_oom(exc):
            raise
        fail(f"Redis at {redact(redis_url)} is full (maxmemory reached, it refuses writes): free memory "
             f"(e.g. `rlfarm checkpoints delete` old runs) or raise its maxmemory; then "
             f"rlfarm train --resume {cfg.run_id}", 1)


def _train_embedded(cfg, run_dir: Path, resume: bool = False):
    import json

    from rlfarm.cluster import LocalCluster
    from rlfarm.envs import allowed_modules_env

    run_dir.mkdir(parents=True, exist_ok=True)
    click.echo(f"rlfarm: no --redis given: starting an embedded Redis and {cfg.farm.workers} local "
               f"worker processes (logs in {run_dir}/)", err=True)
    # The user's own `--env module:callable` is trusted on the user's own local workers.
    cluster = LocalCluster(workers=cfg.farm.workers, name=f"rlfarm-{cfg.run_id}", log_dir=run_dir,
                           extra_env=allowed_modules_env(cfg.env.id))
    try:
        cluster.start(wait=False)
        (run_dir / "cluster.json").write_text(json.dumps(
            {"redis_url": cluster.redis_url, "pids": cluster.pids}) + "\n")
        return _train_on(cfg, cluster.redis_url, run_dir, cluster, resume=resume)
    finally:
        cluster.stop()


def _allow_env_modules(modules: tuple[str, ...]) -> None:
    """`rlfarm worker --allow-env-module`: append to RLFARM_ALLOWED_ENV_MODULES before Celery starts,
    so the worker's pool processes inherit it (rlfarm.envs reads it when it builds an env)."""
    from rlfarm.envs import ALLOWED_MODULES_VAR, allowed_env_modules, valid_module_name

    bad = [m for m in modules if not valid_module_name(m)]
    if bad:
        fail(f"--allow-env-module {bad[0]!r} is not a module name (like mypkg or mypkg.envs)")
    if modules:
        os.environ[ALLOWED_MODULES_VAR] = ",".join(dict.fromkeys([*allowed_env_modules(), *modules]))


@main.command()
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", default="redis://127.0.0.1:6379/0",
              show_default=True, help=REDIS_HELP)
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=os.cpu_count(), show_default=True,
              help="Rollout processes on this machine (one torch thread each).")
@click.option("-n", "--hostname", default=None, help="Celery node name [rlfarm-<pid>@<host>].")
@click.option("-l", "--loglevel", default="INFO", show_default=True, help="Celery log level.")
@click.option("-E", "--events/--no-events", default=False, show_default=True,
              help="Send task events, for Flower (about 1.5 ms per task).")
@click.option("--allow-env-module", "allow_env_module", multiple=True, metavar="MODULE", expose_value=False,
              callback=lambda ctx, param, value: _allow_env_modules(value),
              help="Let this worker build 'MODULE:callable' envs (and MODULE's submodules') named by a "
                   "run's metadata in Redis; repeatable; added to env RLFARM_ALLOWED_ENV_MODULES. "
                   "Registered gymnasium ids need no permission.")
@click.option("--time-limit", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Hard limit in seconds on any task's run time here, whatever the run asks (0: the "
                   "run's own, farm.task_time_limit): a stuck process is killed and replaced.")
@click.option("--redis-outage-timeout", type=click.FloatRange(min=0, min_open=True), default=300,
              show_default=True, help="Seconds a task waits out a Redis outage before it gives up.")
def worker(redis_url: str, concurrency: int, hostname: str | None, loglevel: str, events: bool,
           time_limit: float, redis_outage_timeout: float) -> None:
    """Run a Celery worker with rlfarm's defaults: add this machine's cores to a farm.

    Tasks hold a lease in Redis while they run, so a trainer notices within seconds when this worker
    dies; a task past its hard time limit (a hung env) is killed, its process replaced, and the
    trainer told. A Redis restart is waited out. Warm shutdown on SIGTERM finishes running tasks.
    """
    from rlfarm.store import RedisAuthError, connect

    try:
        connect(redis_url).close()
    except ConnectionError as exc:
        fail(str(exc), 2 if isinstance(exc, RedisAuthError) else 1)
    os.environ["RLFARM_REDIS_URL"] = redis_url
    os.environ["RLFARM_REDIS_OUTAGE_TIMEOUT"] = str(redis_outage_timeout)
    if time_limit:
        os.environ["RLFARM_TASK_TIME_LIMIT"] = str(time_limit)
    from tasks import app

    app.conf.broker_url = redis_url
    # Without gossip and mingle: rlfarm needs neither, and kombu's gossip teardown during a Redis
    # restart can kill the worker's main process ('NoneType' object has no attribute 'hostname').
    app.worker_main(["worker", "--pool", "prefork", "--concurrency", str(concurrency),
                     "--prefetch-multiplier", "1", "-O", "fair", "--loglevel", loglevel,
                     "--without-gossip", "--without-mingle",
                     "--hostname", hostname or f"rlfarm-{os.getpid()}@%h", *(["-E"] if events else [])])


@main.command(name="eval")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False),
              help="A saved policy (e.g. RUN_DIR/final_policy.safetensors).")
@click.option("--run", "run_id", help="A run in Redis (with --redis).")
@click.option("--version", "version", type=PolicyVersion(), default="latest", show_default=True,
              help="Policy version of --run: a number or 'latest'.")
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", help=REDIS_HELP)
@click.option("--env", "env_id", help="Env id [the one the policy was trained on].")
@click.option("--episodes", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first episode.")
def eval_(policy_file: str | None, run_id: str | None, version: int | str, redis_url: str | None,
          env_id: str | None, episodes: int, seed: int) -> None:
    """Run greedy episodes with a stored version or a saved policy file; print mean ± std."""
    import json

    from rlfarm import codec
    from rlfarm.config import ConfigError, policy_config
    from rlfarm.envs import EnvError, check_env_allowed, describe, env_module, make_env
    from rlfarm.policy import build_policy
    from rlfarm.rollout import run_episodes
    from rlfarm.signing import SignatureError, secret_from_env
    from rlfarm.store import PolicyError, PolicyStore, RunNotFound, connect

    if bool(policy_file) == bool(run_id):
        fail("give exactly one of --policy FILE or --run RUN (with --redis URL)")
    try:
        if policy_file:
            # With RLFARM_SECRET set, the file's hmac must verify (CodecError otherwise).
            state, meta = codec.decode_policy(Path(policy_file).read_bytes(), secret_from_env())
            policy_cfg = json.loads(meta.get("policy", "{}"))
        else:
            if not redis_url:
                fail("--run needs --redis URL (or RLFARM_REDIS_URL)")
            store = PolicyStore(connect(redis_url), run_id)
            state, meta = store.get(version)
            run_cfg = store.run_meta()["config"]
            policy_cfg, meta["env"] = run_cfg["policy"], run_cfg["env"]["id"]
        env_given = bool(env_id)
        env_id = env_id or meta.get("env")
        if not env_id:
            fail("the policy does not name its env: pass --env")
        if not env_given:  # named by a file or by Redis: the allowlist, as on a worker
            check_env_allowed(env_id, where="here", hint=f"pass --env {env_id} if you trust it, or set "
                                                         f"RLFARM_ALLOWED_ENV_MODULES={env_module(env_id)}")
        spec = describe(env_id)
        policy = build_policy(spec, policy_config(policy_cfg))
        policy.load_state_dict(state)
    except (codec.CodecError, ConfigError, PolicyError, RunNotFound, EnvError, ConnectionError,
            OSError, SignatureError) as exc:
        fail(str(exc), 1)
    env = make_env(env_id)
    returns = run_episodes(policy.actor_snapshot(), env, episodes, seed)
    click.echo(f"{env_id}, policy v{meta.get('version', '?')}: mean return {returns.mean():.2f} ± "
               f"{returns.std():.2f} over {episodes} greedy episodes")


@main.group()
def checkpoints() -> None:
    """List, export and delete runs and their policy versions stored in Redis."""


@checkpoints.command(name="list")
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", required=True, help=REDIS_HELP)
@click.option("--run", "run_id", help="Run whose versions to list (default: list the runs).")
def checkpoints_list(redis_url: str, run_id: str | None) -> None:
    """Runs in Redis, or the retained versions of one run."""
    from datetime import datetime

    from rich.console import Console
    from rich.table import Table

    from rlfarm.store import PolicyStore, connect, list_runs, redact, run_exists

    try:
        client = connect(redis_url)
    except ConnectionError as exc:
        fail(str(exc), 1)
    if run_id and not run_exists(client, run_id):
        fail(f"no run {run_id!r} in Redis at {redact(redis_url)}", 1)
    if not run_id:
        table = Table("run", "latest version")
        for run in list_runs(client):
            table.add_row(run, str(PolicyStore(client, run).latest()))
        Console().print(table)
        return
    store = PolicyStore(client, run_id)
    table = Table("version", "created", "env steps", "bytes", "sha256")
    for v in store.versions():
        info = store.info(v)
        created = datetime.fromtimestamp(float(info["created"])).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(str(v), created, info.get("env_steps", "-"), info["bytes"], info["sha256"][:16])
    Console().print(table)


@checkpoints.command(name="export")
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", required=True, help=REDIS_HELP)
@click.option("--run", "run_id", required=True, help="Run to export from.")
@click.option("--version", type=PolicyVersion(), default="latest", show_default=True,
              help="Version number or 'latest'.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="File to write (safetensors).")
def checkpoints_export(redis_url: str, run_id: str, version: int | str, output: str) -> None:
    """Write a stored version to a safetensors file (checksum verified), usable with `rlfarm eval`."""
    import json

    from rlfarm import codec
    from rlfarm.signing import SignatureError
    from rlfarm.store import PolicyError, PolicyStore, RunNotFound, connect

    try:
        store = PolicyStore(connect(redis_url), run_id)
        state, meta = store.get(version)
        run_cfg = store.run_meta()["config"]
    except (PolicyError, RunNotFound, ConnectionError, SignatureError) as exc:
        fail(str(exc), 1)
    meta = {**meta, "env": run_cfg["env"]["id"], "policy": json.dumps(run_cfg["policy"])}
    meta.pop("sha256", None)
    # The hmac covers env and policy too: re-signed with RLFARM_SECRET (verified above), else dropped.
    meta.pop("hmac", None)
    Path(output).write_bytes(codec.encode_policy(state, meta, store.secret))
    click.echo(f"wrote {run_id} v{meta['version']} to {output}")


@checkpoints.command(name="delete", short_help="Remove a run and all its keys from Redis.")
@click.argument("run_id", metavar="RUN")
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", required=True, help=REDIS_HELP)
@click.option("--force", is_flag=True,
              help="Delete even while the run's trainer heartbeat says it is running.")
def checkpoints_delete(run_id: str, redis_url: str, force: bool) -> None:
    """Remove a run from Redis: every key under rlfarm:RUN: (policy versions, metadata, trainer
    status, pending results). Its run directory on disk is left alone, so `rlfarm train --resume`
    still works (it publishes its checkpoint's policy again).

    Refused while the run's trainer heartbeat is live (state running; it expires 120 s after a
    trainer dies) unless --force.
    """
    from rlfarm.store import connect, delete_run, read_status, redact

    try:
        client = connect(redis_url)
    except ConnectionError as exc:
        fail(str(exc), 1)
    status = read_status(client, run_id)
    if status.get("state") == "running" and not force:
        where = f" on {status['host']} (pid {status['pid']})" if "host" in status and "pid" in status else ""
        fail(f"run {run_id!r} has a live trainer{where}; stop it first, or pass --force", 1)
    removed = delete_run(client, run_id)
    if not removed:
        fail(f"no run {run_id!r} in Redis at {redact(redis_url)}", 1)
    click.echo(f"deleted run {run_id}: {removed} keys removed from Redis at {redact(redis_url)}")


@main.command()
@click.option("--redis", "redis_url", envvar="RLFARM_REDIS_URL", default="redis://127.0.0.1:6379/0",
              show_default=True, help=REDIS_HELP)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the snapshot as one JSON object (one per line with --watch).")
def status(redis_url: str, watch: bool, interval: float, as_json: bool) -> None:
    """Runs, policy versions, trainer heartbeats, workers, queue depth and Redis memory of a farm."""
    import redis as redis_lib
    from kombu.exceptions import OperationalError
    from rich.console import Console
    from rich.text import Text

    from rlfarm import status as S
    from rlfarm.celery_app import make_app
    from rlfarm.store import connect, redact

    if not interval > 0:  # also rejects NaN
        fail(f"--interval must be a positive number of seconds, got {interval}")
    try:
        client = connect(redis_url)
    except ConnectionError as exc:
        fail(str(exc))
    app = make_app(redis_url)
    # Piped or redirected, rich would assume 80 columns and squeeze the tables; COLUMNS still wins.
    console = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS", 200)))
    lost = (redis_lib.ConnectionError, redis_lib.TimeoutError, OperationalError, ConnectionError)

    def frame() -> object:
        try:
            snap = S.gather(client, app, redis_url)
        except lost as exc:
            if not watch:
                fail(f"lost Redis at {redact(redis_url)}: {exc}", 1)
            # A watcher outlives a Redis restart: say so and try again next interval.
            return Text(f"cannot reach Redis at {redact(redis_url)}; retrying every {interval:g} s",
                        style="red")
        return S.to_json(snap) if as_json else S.render(snap)

    def show(renderable: object) -> None:
        if isinstance(renderable, str):
            click.echo(renderable)
        else:
            console.print(renderable)
        sys.stdout.flush()  # piped output is block-buffered; a reader wants each frame now

    if not watch:
        show(frame())
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    _sigterm_to_interrupt()
    try:
        if console.is_terminal and not as_json:
            from rich.live import Live

            with Live(console=console, auto_refresh=False) as live:
                while True:
                    live.update(frame(), refresh=True)
                    time.sleep(interval)
        else:  # a pipe or a file: frames one after another, each starting with its header line
            while True:
                show(frame())
                if not as_json:
                    click.echo()
                time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how --watch ends: exit 0, no traceback


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Image to write; the format follows the suffix (.png, .svg, .pdf) [RUN_DIR/curves.png].")
def plot(run_dir: Path, output: Path | None) -> None:
    """Plot a run's learning curves: training and evaluation return against env steps and wall time."""
    from rlfarm.plot import PlotError, plot_run

    try:
        out = plot_run(run_dir, output)
    except PlotError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # unwritable path, unknown image format
        fail(f"cannot write {output or run_dir / 'curves.png'}: {exc}")
    click.echo(f"wrote {out}")


@main.command()
def presets() -> None:
    """List the shipped presets, one line each."""
    from rlfarm.config import preset_description, preset_names

    for name in preset_names():
        click.echo(f"{name:<16} {preset_description(name)}")


if __name__ == "__main__":
    main()

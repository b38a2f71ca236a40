"""`rlfarm`: train on a Celery + Redis rollout farm, run workers, evaluate and inspect policies."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from pathlib import Path

import click

from rlfarm.config import bounds as B  # pure and light: the upper bounds of the options below

REDIS_HELP = ("Redis URL of the farm (broker, results and policy store). Omitted: env RLFARM_REDIS_URL, "
              "else the local farm of `rlfarm up` (with its secret). Through Redis Sentinel: "
              "sentinel://h1:26379;sentinel://h2:26379/0?master_name=NAME.")
RUN_FARM_HELP = REDIS_HELP + (" No farm found that way: the run's own embedded Redis "
                              "(runs/RUN/cluster.json) while it trains.")
METRICS_HELP = ("Serve Prometheus metrics at http://HOST:PORT/metrics: {what}. A bare PORT listens on "
                "127.0.0.1; 0.0.0.0:PORT lets a Prometheus on another machine scrape it.")


# Set by the console script only (not when `main` is called in-process, e.g. by click's test runner).
_FAST_EXIT = False


def _exit_now() -> None:
    """After a finished run, skip the interpreter's teardown of torch, TensorBoard and Celery
    (about a second on 2 cores): everything is written and flushed by then."""
    if _FAST_EXIT:
        import logging

        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)


def fail(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
    click.echo(f"rlfarm: error: {message}", err=True)
    sys.exit(code)


def find_farm(redis_url: str | None, run_id: str | None = None, needed: bool = True):
    """The farm a command works on (rlfarm.local.find): --redis, RLFARM_REDIS_URL, the `rlfarm up` farm,
    or the live embedded Redis of the run named. Its secret goes into this process's environment, for
    the worker processes it starts and the signed data it reads; a different RLFARM_SECRET of the user's
    is said in one warning line. `needed`: fail in one line (exit 1) when none is found."""
    from rlfarm.config import RunConfig
    from rlfarm.local.find import find_farm as find, not_found, use_secret

    run_dir = Path(RunConfig.logdir) / run_id if run_id else None
    farm = find(redis_url, run_dir)
    if farm.url is None:
        if needed:
            fail(not_found(run_dir), 1)
        return farm
    warning = use_secret(farm)
    if warning:
        logging.getLogger("rlfarm.cli").warning("%s", warning)
    return farm


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


class SeedList(click.ParamType):
    """`--seeds 1-5`, `--seeds 1,2,3` (rlfarm.config.seeds); bad input is one usage line."""

    name = "seeds"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "A-B|A,B,..."

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        from rlfarm.config import ConfigError
        from rlfarm.config.seeds import parse_seeds

        if isinstance(value, list):
            return value
        try:
            return parse_seeds(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class _UsageLine(click.ClickException):
    """A usage error shown as every other rlfarm error is: one line, exit 2 (click's default is a
    usage block of four lines; `--help` still shows the usage)."""

    exit_code = 2

    def show(self, file: object = None) -> None:
        click.echo(f"rlfarm: error: {self.format_message()}", err=True)


def _one_line(exc: click.UsageError) -> click.ClickException:
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        return exc  # a bare `rlfarm` or `rlfarm checkpoints` shows its help
    message = exc.format_message().rstrip(".")
    message = message[:1].lower() + message[1:]
    if exc.ctx is not None:
        message += f" (see {exc.ctx.command_path} --help)"
    return _UsageLine(message)


class OneLineErrors(click.Group):
    """Turns the usage errors of this group and of its subcommands into one `rlfarm: error:` line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line(exc) from None


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="rlfarm")
@click.option("-v", "--verbose", count=True,
              help="More messages: debug lines too (on stderr; a run's are also in RUN_DIR/rlfarm.log).")
@click.option("-q", "--quiet", count=True,
              help="Warnings and errors only (a run's info lines still go to RUN_DIR/rlfarm.log).")
def main(verbose: int, quiet: int) -> None:
    """rlfarm: RL rollout episodes as Celery tasks on any number of machines, Redis in the middle.

    Start with `rlfarm train` (no Redis running? it starts an embedded one and local workers), or
    `rlfarm up` for a farm that stays up; add machines with `rlfarm worker --redis URL`. Every command
    finds its farm the same way: --redis, else RLFARM_REDIS_URL, else the `rlfarm up` farm.
    """
    from rlfarm.observe.logs import setup_logging

    setup_logging(verbose - quiet)


def _sigterm_to_interrupt() -> None:
    """SIGTERM and SIGINT both stop a run cleanly (workers and embedded Redis stopped, exit 130).

    SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _modes_help() -> str:
    """What each algorithm's modes mean, from the algorithms' own declarations (rlfarm.config)."""
    from rlfarm.config import ALGORITHMS

    per_algo = "; ".join(f"{name}: " + ", ".join(f"{mode} ({meaning})" for mode, meaning in section.modes.items())
                         for name, section in sorted(ALGORITHMS.items()))
    return f"How tasks are scheduled (default: the preset's). {per_algo}."


@main.command()
@click.option("--preset", default="cartpole-ppo", show_default=True,
              help="Preset name (see `rlfarm presets`) or path to a TOML file.")
@click.option("--env", "env_id", help="Gymnasium env id or 'module:callable' (overrides the preset).")
@click.option("--mode", type=click.Choice(["sync", "async"]), help=_modes_help())
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. --set ppo.learning_rate=1e-3 (repeatable).")
@click.option("--redis", "redis_url",
              help=REDIS_HELP + " None of these: an embedded Redis and local workers are started for the "
                   "run.")
@click.option("--workers", type=click.IntRange(min=1, max=B.MAX_WORKERS),
              help=f"Worker processes for the embedded default (at most {B.MAX_WORKERS}).")
@click.option("--share", type=click.FloatRange(min=0, min_open=True), metavar="W",
              help="This run's weight on a farm shared with other runs (farm.share, default 1): the "
                   "farm's worker processes are divided among the runs training at once in proportion "
                   "to their weights; one that needs fewer leaves the rest to the others.")
@click.option("--total-steps", type=click.IntRange(min=1), help="Env steps to train for.")
@click.option("--target-return", type=float,
              help="Stop early once this return is reached: by the greedy evaluation when evaluations "
                   "run (eval.interval > 0), else by the mean of the last 20 training episodes.")
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
@click.option("--seeds", type=SeedList(),
              help=f"Train one run per seed on one farm (e.g. 1-5 or 1,2,3; at most {B.MAX_SEEDS:,} seeds), "
                   "--parallel at a time: run ids RUN_ID-s<seed>, each trainer its own process; prints each "
                   "seed's best and final greedy evaluation and training return with mean ± std, and writes "
                   "LOGDIR/RUN_ID-seeds/summary.json. Without --redis one embedded farm serves them all.")
@click.option("--parallel", type=click.IntRange(min=1, max=B.MAX_PARALLEL_TRAINERS),
              help=f"With --seeds: trainers running at once; the next seed starts when one ends [this "
                   f"machine's cores, at least 2; at most {B.MAX_PARALLEL_TRAINERS}].")
@click.option("--metrics-port", "metrics_port", metavar="[HOST:]PORT", help=METRICS_HELP.format(
                  what="the run's env steps, SPS, tasks wanted, in flight and held, policy version and "
                       "lag, results, re-sends, policy fetches and bytes, Redis outages, the broker's "
                       "queue"))
@click.option("--capture-video", is_flag=True,
              help="Record one greedy episode of each evaluated version to RUN_DIR/videos/*.mp4, in the "
                   "trainer (CleanRL's --capture-video; needs moviepy: pip install -e \".[video]\").")
@click.option("--track", is_flag=True,
              help="Log the run to MLflow (CleanRL's --track): config as params, progress.csv's metrics at "
                   "env steps, best and final policies as artifacts (pip install -e \".[track]\").")
@click.option("--track-uri", metavar="URI",
              help="MLflow tracking URI for --track (implies it) [env MLFLOW_TRACKING_URI, else ./mlruns].")
@click.option("--track-experiment", metavar="NAME", help="MLflow experiment for --track (implies it) [rlfarm].")
@click.pass_context
def train(ctx: click.Context, preset: str, env_id: str | None, mode: str | None,
          overrides: tuple[str, ...], redis_url: str | None, workers: int | None, share: float | None,
          total_steps: int | None, target_return: float | None, seed: int | None,
          run_id: str | None, device: str | None, logdir: str | None, resume: str | None,
          if_exists: str, seeds: list[int] | None, parallel: int | None, metrics_port: str | None,
          capture_video: bool, track: bool, track_uri: str | None, track_experiment: str | None) -> None:
    """Train a policy on the farm and save it under LOGDIR/RUN_ID.

    Writes config.json, progress.csv, episodes.csv, TensorBoard scalars, a trainer checkpoint (for
    --resume) and final_policy.safetensors.
    """
    if parallel is not None and not seeds:
        fail("--parallel is how many seeds train at once; give it with --seeds")
    if seeds:
        if metrics_port:  # one port, several trainers
            fail("--metrics-port serves one trainer's metrics and --seeds starts one trainer per seed; "
                 "train the seeds without it (rlfarm worker --metrics-port and rlfarm status --json "
                 "show the farm)")
        _train_seeds(ctx, seeds)
        return
    listen = _metrics_listen(metrics_port)
    from rlfarm.trainer import resume as checkpoint
    from rlfarm import config as C
    from rlfarm.api import RunExists, check_config, check_extras, check_new_run, run_length_notes, with_run_id
    from rlfarm.envs import EnvError

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
                "device": device, "farm.share": share})
        else:
            cfg = C.build(preset, overrides, **{
                "env.id": env_id, "mode": mode, "farm.workers": workers, "farm.share": share,
                "total_steps": total_steps,
                "target_return": target_return, "seed": seed, "run_id": run_id, "device": device,
                "logdir": logdir})
        farm = _train_farm(redis_url)
        check_config(cfg, embedded=farm.url is None)
        tracking = check_extras(cfg, capture_video, track_uri or track, track_experiment)
    except (C.ConfigError, EnvError) as exc:
        fail(str(exc))
    for level, note in run_length_notes(cfg):  # iterations rounded up; episodes longer than a task
        logging.getLogger("rlfarm.cli").log(level, "%s", note)
    cfg = with_run_id(cfg)
    run_dir = Path(cfg.logdir) / cfg.run_id
    try:
        if not resume:
            check_new_run(cfg)
    except RunExists as exc:
        fail(f"run {exc.run_id} already exists in {exc.run_dir.parent}/; continue it with --resume "
             f"{exc.run_id}, or choose another --run-id")
    _sigterm_to_interrupt()
    try:
        result = _train(cfg, farm, resume=bool(resume), metrics=listen, capture_video=capture_video,
                        tracking=tracking)
    except KeyboardInterrupt:
        if not farm.url:  # only the embedded default owns (and has now stopped) its workers and Redis
            click.echo("rlfarm: interrupted; workers and Redis stopped", err=True)
        else:
            click.echo(_interrupted_on_redis(farm, cfg, run_dir), err=True)
        sys.exit(130)
    evaluated = "" if result.eval_mean_return != result.eval_mean_return else (
        f", greedy evaluation of the final policy {result.eval_mean_return:.1f}")
    click.echo(f"run {result.run_id}: {result.env_steps} env steps in {result.wall_seconds:.1f} s, "
               f"policy v{result.final_version}, mean return of the last 20 training episodes "
               f"{result.rolling_return:.1f} (best {result.best_rolling_return:.1f}, while exploring){evaluated}")
    if result.best_policy is not None:
        target = "" if math.isinf(cfg.target_return) else (  # a run without a target has none to reach
            f"; target {cfg.target_return:g} {'reached' if result.target_reached else 'not reached'}")
        click.echo(f"best policy: v{result.best_version}, greedy evaluation {result.best_eval_mean_return:.1f} "
                   f"(best_policy.safetensors){target}")
    click.echo(f"saved to {run_dir}/ (final_policy.safetensors sha256 {result.policy_sha256[:16]})")
    _exit_now()


# Options of `train` a seed's trainer does not get as given: --seeds makes its own --seed, --run-id and
# --logdir, --parallel is the parent's, the farm (--redis, --workers) is the one started for all the
# seeds, and --resume is refused.
_SEEDS_OWN = {"seeds", "parallel", "seed", "run_id", "logdir", "redis_url", "workers", "resume"}


def _passed_through(ctx: click.Context, own: set[str]) -> list[str]:
    """The options the user gave this command (not defaults), as arguments for a child `rlfarm train`.
    Generic, so an option added to `train` later (e.g. --share) reaches every child unchanged."""
    args: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in own:
            continue
        source = ctx.get_parameter_source(param.name)
        if source in (None, click.core.ParameterSource.DEFAULT):
            continue
        value, flag = ctx.params[param.name], max(param.opts, key=len)
        if param.is_flag:
            args += [flag] if value else [max(param.secondary_opts, key=len)] if param.secondary_opts else []
        else:
            args += [a for v in (value if param.multiple else [value]) for a in (flag, str(v))]
    return args


def _train_seeds(ctx: click.Context, seeds: list[int]) -> None:
    """`rlfarm train --seeds`: checks first, then one farm, a trainer subprocess per seed, the table."""
    from rich.console import Console

    from rlfarm import config as C
    from rlfarm.api import RunExists, check_config, check_extras, check_new_run, with_run_id
    from rlfarm.envs import EnvError, allowed_modules_env
    from rlfarm.config.seeds import compact_seeds
    from rlfarm.local.shared import farm_for_trainers
    from rlfarm.tune import seeds as S

    p = ctx.params
    for name, flag in (("seed", "--seed"), ("resume", "--resume")):
        if p.get(name) is not None:
            fail(f"--seeds runs one run per seed; it cannot be combined with {flag}")
    try:
        cfg = C.build(p["preset"], p["overrides"], **{
            "env.id": p["env_id"], "mode": p["mode"], "farm.workers": p["workers"],
            "total_steps": p["total_steps"], "target_return": p["target_return"], "seed": seeds[0],
            "run_id": p["run_id"], "device": p["device"], "logdir": p["logdir"]})
        check_config(cfg)
        check_extras(cfg, p["capture_video"], p["track_uri"] or p["track"], p["track_experiment"])
        base = with_run_id(cfg).run_id
        for seed in seeds:
            check_new_run(C.from_flat({"run_id": S.seed_run_id(base, seed)}, cfg))
    except RunExists as exc:
        fail(f"run {exc.run_id} already exists in {exc.run_dir.parent}/; choose another --run-id")
    except (C.ConfigError, EnvError) as exc:
        fail(str(exc))
    logdir = Path(cfg.logdir)
    seeds_dir = logdir / f"{base}-seeds"
    seeds_dir.mkdir(parents=True, exist_ok=True)
    farm = find_farm(p["redis_url"], needed=False)
    # Trainers run on this machine whatever the farm: one per core (each learner needs one while it
    # learns), at least 2 so seeds share the farm as they always did on small machines.
    parallel = min(len(seeds), p["parallel"] or min(max(2, C.machine_cores()), B.MAX_PARALLEL_TRAINERS))
    _sigterm_to_interrupt()
    note = logging.getLogger("rlfarm.cli").info
    try:
        with farm_for_trainers(farm, C.local_workers(cfg), seeds_dir / "farm", f"rlfarm-{base}",
                               allowed_modules_env(cfg.env.id), notify=note) as env:
            at_once = "all at once" if parallel == len(seeds) else f"{parallel} at a time"
            note(f"training {len(seeds)} seeds ({compact_seeds(seeds)}) {at_once}: runs {base}-s<seed> in "
                 f"{logdir}/, trainer output in {seeds_dir}/s<seed>.log")
            runs = S.run_seeds(_passed_through(ctx, _SEEDS_OWN), seeds, base, logdir, env, seeds_dir, parallel)
    except S.StartFailed as exc:  # one line, not fork's traceback; the farm is stopped by now
        fail(f"{exc}; this machine's process limit (ulimit -u, a container's pids limit) or memory is "
             f"reached: lower --parallel (it was {parallel})", 1)
    except KeyboardInterrupt:
        click.echo("rlfarm: interrupted; every seed's trainer stopped" +
                   ("" if farm.url else ", and the embedded workers and Redis"), err=True)
        sys.exit(130)
    summary = S.aggregate(runs)
    path = S.write_summary(seeds_dir, summary)
    Console(width=None if sys.stdout.isatty() else 160).print(S.table(summary))
    click.echo(f"summary of {len(seeds)} seeds written to {path}")
    if summary["failed"]:
        fail(f"seed{'s' if len(summary['failed']) > 1 else ''} {compact_seeds(summary['failed'])} "
             f"failed (see {seeds_dir}/s<seed>.log); the others finished", 1)


def _train_farm(redis_url: str | None):
    """The farm `rlfarm train` trains on (Farm(None): the embedded default). The trainer takes the farm's
    secret from the Farm (rlfarm.api.run), not from RLFARM_SECRET, which signs the run directory's files."""
    from rlfarm.local.find import find_farm as find

    return find(redis_url)


def _interrupted_on_redis(farm, cfg, run_dir: Path) -> str:
    """The line for a run on a farm (--redis) stopped by Ctrl-C: its workers and Redis are not this
    process's and keep running; say how to continue the run from its checkpoint."""
    import shlex

    from rlfarm.trainer import resume as checkpoint
    from rlfarm.config import RunConfig
    from rlfarm.farm.connection import redact

    if not checkpoint.path_in(run_dir).is_file():
        return (f"rlfarm: interrupted before run {cfg.run_id} saved its first checkpoint, nothing to "
                f"resume; to start it again under that id, remove {run_dir}/ and run "
                f"`rlfarm checkpoints delete {cfg.run_id}`")
    command = f"rlfarm train --resume {cfg.run_id}"
    if Path(cfg.logdir) != Path(RunConfig.logdir):
        command += f" --logdir {shlex.quote(cfg.logdir)}"
    if farm.source.startswith("--redis"):  # RLFARM_REDIS_URL and the up farm are found again by themselves
        command += f" --redis {shlex.quote(redact(farm.url))}"  # password masked: retype it
    return f"rlfarm: interrupted; run {cfg.run_id} can continue with: {command}"


def _resume_config(run: str, logdir: str | None, changes: dict):
    """The config of the run to resume (from its run directory), with the few allowed changes."""
    from rlfarm.api import resume_config

    return resume_config(run, logdir, **{k.replace("farm.workers", "workers"): v for k, v in changes.items()})


def _train(cfg, farm, resume: bool = False, metrics: tuple[str, int] | None = None, **extras):
    """rlfarm.api.run, with every failure it can meet turned into one line and an exit status."""
    from rlfarm.api import run
    from rlfarm.observe.exporter import MetricsError
    from rlfarm.trainer.resume import CheckpointError
    from rlfarm.farm.claim import ClaimLost, RunInUse
    from rlfarm.config import ConfigError
    from rlfarm.farm.dispatch import RolloutError, TaskLostError
    from rlfarm.observe.logs import log_fatal
    from rlfarm.farm.outage import RedisUnavailable, is_oom
    from rlfarm.observe.rundir import RunDirError
    from rlfarm.farm.connection import RedisAuthError, RedisEvicts, redact

    def fatal(message: str, code: int = 2) -> "NoReturn":  # noqa: F821
        log_fatal(Path(cfg.logdir) / cfg.run_id, message)  # the console's last line, in the run's log too
        fail(message, code)

    try:  # start-up notes go through logging: `rlfarm: ...` on stderr, hidden by -q
        return run(cfg, farm.url, resume=resume, notify=logging.getLogger("rlfarm.cli").info, metrics=metrics,
                   farm=farm, **extras)
    except RedisAuthError as exc:  # wrong credentials are a usage error (2), like a bad option
        fatal(str(exc), 2)
    except (ConfigError, CheckpointError) as exc:
        fatal(str(exc))
    except (RolloutError, TaskLostError, RedisEvicts) as exc:
        fatal(str(exc), 1)
    except MetricsError as exc:  # its port was taken between the check and the start
        fatal(str(exc), 1)
    except (RunInUse, ClaimLost) as exc:  # another trainer has the run id or its directory
        fatal(str(exc), 1)  # (into this process's own run log only, never the other trainer's)
    except RunDirError as exc:  # disk full, directory read-only: files are whole, the checkpoint too
        fatal(f"{exc}; the run stopped with its last checkpoint whole: make room (or make "
              f"{exc.path.parent} writable), then rlfarm train --resume {cfg.run_id}", 1)
    except RedisUnavailable as exc:
        fatal(f"{exc}; the run can continue once Redis is back: rlfarm train --resume {cfg.run_id}", 1)
    except ConnectionError as exc:  # Redis unreachable at the start
        fatal(str(exc), 1)
    except Exception as exc:  # noqa: BLE001 - only Redis refusing writes is turned into one line here
        if not is_oom(exc):
            raise
        fatal(f"Redis at {redact(farm.url or 'the embedded Redis')} is full (maxmemory reached, it "
              f"refuses writes): free memory (e.g. `rlfarm checkpoints delete` old runs) or raise its "
              f"maxmemory; then rlfarm train --resume {cfg.run_id}", 1)


def _metrics_listen(value: str | None) -> tuple[str, int] | None:
    """--metrics-port checked before anything starts: its form, prometheus_client, a free port."""
    if value is None:
        return None
    import socket

    from rlfarm.observe.exporter import MetricsError, check_available, parse_listen

    try:
        host, port = parse_listen(value)
        check_available()
    except MetricsError as exc:
        fail(str(exc))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            fail(f"--metrics-port {value}: cannot listen on {host}:{port}: {exc.strerror or exc}", 1)
    return host, port


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
@click.option("--redis", "redis_url",
              help=REDIS_HELP + " A farm's Redis needs a password, redis://:PASSWORD@host:6379/0 (a "
                   "warning says so when a Redis on another address lets this worker in without one).")
@click.option("-c", "--concurrency", type=click.IntRange(min=1, max=B.MAX_WORKERS),
              default=min(os.cpu_count() or 1, B.MAX_WORKERS), show_default=True,
              help=f"Rollout processes on this machine (one torch thread each; at most {B.MAX_WORKERS}).")
@click.option("-n", "--hostname", default=None, help="Celery node name [rlfarm-<pid>@<host>].")
@click.option("-l", "--loglevel", default="INFO", show_default=True,
              help="Celery log level [WARNING with rlfarm -q, DEBUG with rlfarm -v].")
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
@click.option("--shutdown-grace", type=click.FloatRange(min=0), default=10, show_default=True,
              help="On SIGTERM (a spot instance's notice, docker stop) running tasks are handed back at "
                   "once, for their trainer to send again; a process that has not let go of its task "
                   "after this many seconds (an env stuck in C code) is killed, and the worker exits.")
@click.option("--metrics-port", "metrics_port", metavar="[HOST:]PORT", help=METRICS_HELP.format(
                  what="this worker's slots, busy slots, tasks, policy fetches and their bytes, Redis outages"))
@click.pass_context
def worker(ctx: click.Context, redis_url: str | None, concurrency: int, hostname: str | None, loglevel: str,
           events: bool, time_limit: float, redis_outage_timeout: float, shutdown_grace: float,
           metrics_port: str | None) -> None:
    """Run a Celery worker with rlfarm's defaults: add this machine's cores to a farm.

    Tasks hold a lease in Redis while they run, so a trainer notices within seconds when this worker
    dies; a task past its hard time limit (a hung env) is killed, its process replaced, and the
    trainer told. A Redis restart is waited out. On SIGTERM running tasks are handed back to their
    trainers at once and the worker exits within --shutdown-grace seconds.
    """
    import logging

    from rlfarm.observe import logs
    from rlfarm.core.signing import secret_from_env
    from rlfarm.farm.connection import RedisAuthError, connect, eviction_error, no_password_warning, no_secret_warning

    listen = _metrics_listen(metrics_port)
    farm = find_farm(redis_url)  # with the up farm, its secret too: its trainers sign their tasks with it
    redis_url = farm.url
    try:
        probe = connect(redis_url)
    except ConnectionError as exc:
        fail(str(exc), 2 if isinstance(exc, RedisAuthError) else 1)
    evicts = eviction_error(probe, redis_url)
    probe.close()
    if evicts:
        fail(evicts, 1)
    logging.getLogger("rlfarm.worker").info("farm: %s", _describe(farm))  # reached: a failure stays one line
    for warning in (no_password_warning(redis_url),  # it let us in without one
                    no_secret_warning(redis_url, secret_from_env())):
        if warning:
            logging.getLogger("rlfarm.worker").warning("%s", warning)
    if ctx.get_parameter_source("loglevel") is click.core.ParameterSource.DEFAULT and logs.verbosity():
        loglevel = "WARNING" if logs.verbosity() < 0 else "DEBUG"
    logs.hand_over_to_celery()  # from here on Celery's logging prints rlfarm's records too
    os.environ["RLFARM_REDIS_URL"] = redis_url
    os.environ["RLFARM_REDIS_OUTAGE_TIMEOUT"] = str(redis_outage_timeout)
    os.environ["RLFARM_SHUTDOWN_GRACE"] = str(shutdown_grace)
    if time_limit:
        os.environ["RLFARM_TASK_TIME_LIMIT"] = str(time_limit)
    if listen:  # served by the worker's main process once its pool runs (rlfarm.worker.hooks)
        os.environ["RLFARM_METRICS_ADDR"] = f"[{listen[0]}]:{listen[1]}"
    from rlfarm.farm.app import celery_settings
    from rlfarm.worker.app import app

    app.conf.update(celery_settings(redis_url))
    # Without gossip and mingle: rlfarm needs neither, and kombu's gossip teardown during a Redis
    # restart can kill the worker's main process ('NoneType' object has no attribute 'hostname').
    app.worker_main(["worker", "--pool", "prefork", "--concurrency", str(concurrency),
                     "--prefetch-multiplier", "1", "-O", "fair", "--loglevel", loglevel,
                     "--without-gossip", "--without-mingle",
                     "--hostname", hostname or f"rlfarm-{os.getpid()}@%h", *(["-E"] if events else [])])


def _describe(farm) -> str:
    from rlfarm.local.find import describe

    return describe(farm)


@main.command()
@click.option("-w", "--workers", type=click.IntRange(min=1, max=B.MAX_WORKERS),
              default=min(os.cpu_count() or 1, B.MAX_WORKERS), show_default=True,
              help=f"Worker processes of the local farm (at most {B.MAX_WORKERS}).")
@click.option("--allow-env-module", "modules", multiple=True, metavar="MODULE",
              help="Let its workers build 'MODULE:callable' envs (repeatable).")
def up(workers: int, modules: tuple[str, ...]) -> None:
    """Start a local farm that stays up: a Redis on 127.0.0.1 and WORKERS worker processes.

    Until `rlfarm down`, every command without --redis or RLFARM_REDIS_URL uses it: `rlfarm train`
    trains on it and skips the start-up of an embedded Redis and workers, `rlfarm worker` adds
    workers to it, `rlfarm status` shows it. Its URL (with a random password), its RLFARM_SECRET and
    logs are under $RLFARM_HOME (default ~/.cache/rlfarm; local-farm.json, mode 0600).
    """
    from rlfarm.local import farm as localfarm
    from rlfarm.envs import ALLOWED_MODULES_VAR, allowed_env_modules, valid_module_name
    from rlfarm.farm.connection import redact

    bad = [m for m in modules if not valid_module_name(m)]
    if bad:
        fail(f"--allow-env-module {bad[0]!r} is not a module name (like mypkg or mypkg.envs)")
    env = {ALLOWED_MODULES_VAR: ",".join(dict.fromkeys([*allowed_env_modules(), *modules]))} if modules else {}
    try:
        state = localfarm.up(workers, extra_env=env)
    except (localfarm.LocalFarmError, OSError) as exc:
        fail(str(exc), 1)
    click.echo(f"local farm up: Redis {redact(state['redis_url'])}, {workers} worker processes, logs in "
               f"{state['logs']}; `rlfarm train` uses it until `rlfarm down`")
    click.echo(f"more workers on this machine: `rlfarm worker -c N` (it finds this farm and its secret by "
               f"itself, as status, eval --run, checkpoints and sweep do); its URL and secret, e.g. for "
               f"Flower (RLFARM_REDIS_URL): {localfarm.state_path()} (redis_url, secret)")


@main.command()
def down() -> None:
    """Stop the local farm started by `rlfarm up`."""
    from rlfarm.local import farm as localfarm

    pids = localfarm.down()
    click.echo(f"local farm stopped ({len(pids)} processes)" if pids else "no local farm was up")


@main.command(name="eval")
@click.argument("run_name", metavar="[RUN]", required=False)
@click.option("--logdir", type=click.Path(file_okay=False),
              help="Where RUN's directory is: RUN may be a run id under it, or a run directory [runs].")
@click.option("--policy", "policy_file", type=click.Path(exists=True, dir_okay=False),
              help="A saved policy (e.g. RUN_DIR/final_policy.safetensors).")
@click.option("--run", "run_id", help="A run in the farm's Redis (its newest or --version version).")
@click.option("--version", "version", type=PolicyVersion(), default="latest", show_default=True,
              help="Policy version of --run: a number or 'latest'.")
@click.option("--redis", "redis_url", help=RUN_FARM_HELP)
@click.option("--env", "env_id", help="Env id [the one the policy was trained on].")
@click.option("--episodes", type=click.IntRange(min=1, max=B.MAX_EPISODES), default=10, show_default=True,
              help=f"Greedy episodes to play (at most {B.MAX_EPISODES:,}).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first episode.")
@click.option("--video", "video_dir", type=click.Path(file_okay=False),
              help='Record every episode to an .mp4 file in this directory (needs moviepy: '
                   'pip install -e ".[video]").')
@click.option("--render", is_flag=True, help="Watch the episodes in a window (needs a display).")
@click.pass_context
def eval_(ctx: click.Context, run_name: str | None, logdir: str | None, policy_file: str | None,
          run_id: str | None, version: int | str, redis_url: str | None, env_id: str | None, episodes: int,
          seed: int, video_dir: str | None, render: bool) -> None:
    """Run greedy episodes with a run's best policy, a saved policy file or a stored version; print
    mean ± std.

    `rlfarm eval RUN` plays RUN's best_policy.safetensors (else its final_policy.safetensors) from
    --logdir on the env of its config.json, like rl-baselines3-zoo's enjoy. Any algorithm: the
    network is the one the policy's metadata names (algo). --video DIR records the episodes,
    --render shows them.
    """
    from rlfarm.observe import playback

    if sum(map(bool, (run_name, policy_file, run_id))) != 1:
        fail("give exactly one of RUN (a run directory's best policy), --policy FILE or --run RUN (Redis)")
    if run_name and ctx.get_parameter_source("version") is not click.core.ParameterSource.DEFAULT:
        fail("--version picks a version of --run RUN in Redis; RUN plays its run directory's best (else "
             "final) policy file")
    if logdir and not run_name:
        fail("--logdir is where RUN's directory is; give it with RUN")
    if video_dir and render:
        fail("give --video DIR (record) or --render (watch), not both")
    if video_dir:
        try:
            import moviepy  # noqa: F401 - gymnasium's RecordVideo writes the .mp4 files with it
        except ImportError:
            fail('--video needs moviepy, which is not installed: pip install -e ".[video]"', 1)
    if render and sys.platform.startswith("linux") and not any(
            os.environ.get(var) for var in ("DISPLAY", "WAYLAND_DISPLAY", "SDL_VIDEODRIVER")):
        fail("--render opens a window, but there is no display here (DISPLAY is not set); record the "
             "episodes to files instead with --video DIR", 1)
    render_mode = "rgb_array" if video_dir else "human" if render else None
    if run_id:
        redis_url = find_farm(redis_url, run_id).url
    try:
        if run_name:
            policy = playback.from_run_dir(run_name, logdir)
            click.echo(f"run {Path(policy.source).parent.name}: {Path(policy.source).name} (policy v{policy.version})")
        elif policy_file:
            policy = playback.from_file(policy_file)
        else:
            policy = playback.from_run(redis_url, run_id, version)
        env, env_id = playback.open_env(policy, env_id, render_mode)
        network = playback.network_for(policy, env, env_id)
        name = f"{policy.algo}-{env_id.split(':')[-1].replace('/', '-')}-policy{policy.meta.get('version', '')}"
        returns = playback.play(network, policy.algo, env, env_id, episodes, seed, render_mode, video_dir, name)
    except playback.PlaybackError as exc:
        fail(str(exc), exc.code)
    except KeyboardInterrupt:  # stop watching
        click.echo("rlfarm: interrupted", err=True)
        sys.exit(130)
    click.echo(f"{env_id}, policy v{policy.version}: mean return {returns.mean():.2f} ± "
               f"{returns.std():.2f} over {episodes} greedy episodes")
    if video_dir:
        videos = sorted(Path(video_dir).glob("*.mp4"))
        click.echo(f"recorded {episodes} episode{'s' if episodes > 1 else ''} to {video_dir}/ "
                   f"({len(videos)} .mp4 files there)")


@main.group(cls=OneLineErrors)
def checkpoints() -> None:
    """List, export and delete runs and their policy versions stored in Redis."""


@checkpoints.command(name="list")
@click.option("--redis", "redis_url", help=RUN_FARM_HELP)
@click.option("--run", "run_id", help="Run whose versions to list (default: list the runs).")
def checkpoints_list(redis_url: str | None, run_id: str | None) -> None:
    """Runs in Redis, or the retained versions of one run."""
    from datetime import datetime

    from rich.console import Console
    from rich.table import Table

    from rlfarm.farm.connection import connect, redact
    from rlfarm.farm.runs import list_runs, run_exists
    from rlfarm.farm.store import PolicyStore

    redis_url = find_farm(redis_url, run_id).url
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
@click.option("--redis", "redis_url", help=RUN_FARM_HELP)
@click.option("--run", "run_id", required=True, help="Run to export from.")
@click.option("--version", type=PolicyVersion(), default="latest", show_default=True,
              help="Version number or 'latest'.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="File to write (safetensors).")
def checkpoints_export(redis_url: str | None, run_id: str, version: int | str, output: str) -> None:
    """Write a stored version to a safetensors file (checksum verified), usable with `rlfarm eval`."""
    from rlfarm.core.signing import SignatureError
    from rlfarm.farm.connection import connect
    from rlfarm.farm.store import PolicyError, PolicyStore, RunNotFound

    redis_url = find_farm(redis_url, run_id).url
    try:
        blob, number = PolicyStore(connect(redis_url), run_id).export(version)
    except (PolicyError, RunNotFound, ConnectionError, SignatureError) as exc:
        fail(str(exc), 1)
    Path(output).write_bytes(blob)
    click.echo(f"wrote {run_id} v{number} to {output}")


@checkpoints.command(name="delete", short_help="Remove a run and all its keys from Redis.")
@click.argument("run_id", metavar="RUN")
@click.option("--redis", "redis_url", help=RUN_FARM_HELP)
@click.option("--force", is_flag=True,
              help="Delete even while the run's trainer heartbeat says it is running.")
def checkpoints_delete(run_id: str, redis_url: str | None, force: bool) -> None:
    """Remove a run from Redis: every key under rlfarm:RUN: (policy versions, metadata, trainer
    status, pending results). Its run directory on disk is left alone, so `rlfarm train --resume`
    still works (it publishes its checkpoint's policy again).

    Refused while the run's trainer heartbeat is live (state running; it expires 120 s after a
    trainer dies) unless --force.
    """
    from rlfarm.farm.connection import connect, redact
    from rlfarm.farm.runs import delete_run, read_status

    redis_url = find_farm(redis_url, run_id).url
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
@click.option("--redis", "redis_url", help=REDIS_HELP)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=float, default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the snapshot as one JSON object (one per line with --watch).")
def status(redis_url: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """Runs, policy versions, trainer heartbeats, workers, queue depth and Redis memory of a farm.

    Its first line says which farm it looked at and how it was found (--json: farm.source)."""
    import redis as redis_lib
    from kombu.exceptions import OperationalError
    from rich.console import Console
    from rich.text import Text

    from rlfarm.observe import status as S
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect, eviction_error, redact

    if not interval > 0:  # also rejects NaN
        fail(f"--interval must be a positive number of seconds, got {interval}")
    farm = find_farm(redis_url)
    redis_url = farm.url
    try:
        client = connect(redis_url)
    except ConnectionError as exc:  # as `train` and `worker`: 1 unreachable, 2 wrong credentials
        from rlfarm.farm.connection import RedisAuthError

        fail(str(exc), 2 if isinstance(exc, RedisAuthError) else 1)
    evicts = eviction_error(client, redis_url)
    if evicts:  # status only reads: it still shows what is there, after saying why runs would fail
        click.echo(f"rlfarm: warning: {evicts}", err=True)
    app = make_app(redis_url)
    # Piped or redirected, rich would assume 80 columns and squeeze the tables; COLUMNS still wins.
    console = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS", 200)))
    lost = (redis_lib.ConnectionError, redis_lib.TimeoutError, OperationalError, ConnectionError)

    def frame() -> object:
        try:
            snap = S.gather(client, app, redis_url, source=farm.source)
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
    from rlfarm.observe.plot import PlotError, plot_run

    try:
        out = plot_run(run_dir, output)
    except PlotError as exc:
        fail(str(exc))
    except (OSError, ValueError) as exc:  # unwritable path, unknown image format
        fail(f"cannot write {output or run_dir / 'curves.png'}: {exc}")
    click.echo(f"wrote {out}")


@main.command()
@click.option("--preset", default="cartpole-ppo", show_default=True,
              help="The config every trial starts from: a preset name or a TOML file.")
@click.option("--space", "space_file", type=click.Path(dir_okay=False),
              help='TOML file with a [space] table: "ppo.learning_rate" = { low = 1e-4, high = 1e-2, '
                   'log = true } (ints when low and high are ints; step optional), "ppo.update_epochs" = '
                   '{ choices = [4, 10] }.  [required]')
@click.option("--trials", type=click.IntRange(min=1, max=B.MAX_TRIALS), default=16, show_default=True,
              help=f"Trials this command runs (each machine sweeping the same study runs its own; at most "
                   f"{B.MAX_TRIALS:,}).")
@click.option("--parallel", type=click.IntRange(min=1, max=B.MAX_PARALLEL_TRAINERS), default=2, show_default=True,
              help=f"Trials running at once, each a `rlfarm train` process (at most {B.MAX_PARALLEL_TRAINERS}).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key of every trial (repeatable), e.g. --set total_steps=50000.")
@click.option("--total-steps", type=click.IntRange(min=1), help="Env steps of each trial's run.")
@click.option("--mode", type=click.Choice(["sync", "async"]), help="Mode of each trial's run.")
@click.option("--redis", "redis_url",
              help=REDIS_HELP + " The study is kept there too (Optuna's journal storage), so sweeps on "
                   "several machines against one Redis share it. None of these: an embedded Redis and "
                   "local workers for the whole sweep, the study living in it until the sweep ends.")
@click.option("--workers", type=click.IntRange(min=1, max=B.MAX_WORKERS),
              help=f"Worker processes of the embedded farm (at most {B.MAX_WORKERS}).")
@click.option("--study", "study_name", help="Study name (default: generated); trials' run ids are STUDY-t<number>.")
@click.option("--resume", "resume", metavar="STUDY",
              help="Continue the study STUDY in --redis (new trials after its own; a study without "
                   "--redis ended with its sweep).")
@click.option("--pruner", type=click.Choice(["median", "hyperband", "threshold", "none"]), default="median",
              show_default=True,
              help="Stop unpromising trials early: median (below the median of earlier trials at the same "
                   "step, after 5 trials), hyperband, threshold (below --prune-below), none.")
@click.option("--prune-below", type=float, help="With --pruner threshold: stop a trial whose value falls below this.")
@click.option("--prune-warmup", type=click.IntRange(min=0),
              help="Env steps of a run before it may be pruned [a quarter of its total steps].")
@click.option("--metric", type=click.Choice(["eval", "return"]),
              help="What a trial is scored and pruned by: eval, its greedy evaluations (the best one is "
                   "the score); return, the mean of its last 20 training episodes (the best one is the "
                   "score) [eval when the config runs evaluations (eval.interval > 0), else return].")
@click.option("--seed", type=int, help="Seed of Optuna's sampler (the runs keep the config's seed).")
@click.option("--logdir", type=click.Path(file_okay=False),
              help="Parent of the sweep's directory LOGDIR/STUDY, which holds the trials' run "
                   "directories, trials.csv and best.toml [runs].")
def sweep(preset: str, space_file: str | None, trials: int, parallel: int, overrides: tuple[str, ...],
          total_steps: int | None, mode: str | None, redis_url: str | None, workers: int | None,
          study_name: str | None, resume: str | None, pruner: str, prune_below: float | None,
          prune_warmup: int | None, metric: str | None, seed: int | None, logdir: str | None) -> None:
    """Tune hyperparameters with Optuna: every trial an ordinary run on the farm.

    Trials run --parallel at a time; their evaluations (or returns) are reported while they run and
    the pruner stops the unpromising ones (SIGTERM to their trainer: PRUNED). A trainer that fails or
    is killed makes its trial FAILED (not retried) and the sweep goes on. A trial whose params are not
    in the space (one enqueued by someone else) is REFUSED, never trained. Writes LOGDIR/STUDY/
    trials.csv and best.toml (`rlfarm train --preset LOGDIR/STUDY/best.toml`), the best COMPLETE trial
    whose params are in the space (and, with RLFARM_SECRET, signed by a sweep). Exit status: 0 when
    every trial ended COMPLETE or PRUNED, 1 when one FAILED or was REFUSED (after the others ran),
    130 when stopped.
    """
    from rlfarm import config as C
    from rlfarm.api import check_config
    from rlfarm.config.space import load_space
    from rlfarm.envs import EnvError, allowed_modules_env
    from rlfarm.tune.study import SweepError, make_pruner, optuna

    if not space_file:
        fail("--space FILE is required: a TOML file with a [space] table (see rlfarm sweep --help)")
    if resume and study_name and resume != study_name:
        fail(f"--resume {resume} continues that study; --study {study_name} names another")
    farm = find_farm(redis_url, needed=False)
    if resume and not farm.url:
        fail("--resume needs --redis URL (or RLFARM_REDIS_URL, or the `rlfarm up` farm; none found): a study "
             "lives in the farm's Redis, and one without a farm ended with its sweep's embedded Redis")
    if (pruner == "threshold") != (prune_below is not None):
        fail("--pruner threshold needs --prune-below VALUE" if pruner == "threshold"
             else "--prune-below goes with --pruner threshold")
    try:
        base = C.load_preset(preset)
        base.update(C.parse_override(text) for text in overrides)
        base.update({k: v for k, v in {"total_steps": total_steps, "mode": mode, "farm.workers": workers}.items()
                     if v is not None})
        cfg = C.from_flat(base)
        params = load_space(space_file, base)
        check_config(cfg)
        optuna()
    except (C.ConfigError, EnvError, SweepError) as exc:
        fail(str(exc))
    metric = metric or ("eval" if cfg.eval.interval else "return")
    if metric == "eval" and not cfg.eval.interval:
        fail("--metric eval needs greedy evaluations during the runs: set eval.interval (e.g. --set "
             "eval.interval=10240), or use --metric return")
    name = resume or study_name or f"sweep-{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    sweep_dir = Path(logdir or C.RunConfig.logdir) / name
    warmup = cfg.total_steps // 4 if prune_warmup is None else prune_warmup
    child_args = ["--preset", str(Path(preset).resolve()) if Path(preset).suffix == ".toml" else preset,
                  *(a for o in overrides for a in ("--set", o)),
                  *(["--total-steps", str(total_steps)] if total_steps else []),
                  *(["--mode", mode] if mode else [])]
    _sigterm_to_interrupt()
    try:
        _sweep(name, sweep_dir, farm, cfg, base, params, child_args, metric, trials, parallel,
               make_pruner(pruner, warmup, cfg.total_steps, prune_below), bool(resume), seed,
               allowed_modules_env(cfg.env.id))
    except SweepError as exc:
        fail(str(exc), 1)


def _sweep(name, sweep_dir: Path, farm, cfg, base, params, child_args, metric, trials, parallel,
           pruner, resume, seed, worker_env) -> None:
    """The sweep on its farm: the live table, trials.csv and best.toml, the exit status."""
    from rich.console import Console
    from rich.live import Live

    from rlfarm import config as C
    from rlfarm.core.signing import secret_from_env
    from rlfarm.local.shared import REDIS_ENV, farm_for_trainers
    from rlfarm.tune.report import skipped_line, trial_line, trials_table, write_best, write_trials_csv
    from rlfarm.tune.study import open_study, study_place
    from rlfarm.tune.sweep import Sweep

    note = logging.getLogger("rlfarm.cli").info
    console = Console() if sys.stdout.isatty() else Console(width=160)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    try:
        with farm_for_trainers(farm, C.local_workers(cfg), sweep_dir / "farm", f"rlfarm-{name}",
                               worker_env, notify=note) as env:
            study = open_study(env[REDIS_ENV], name, resume, pruner, seed)
            secret = secret_from_env({**os.environ, **env})  # the trainers' secret, as the sweep signs with it
            note(f"study {name} {'resumed' if resume else 'created'} {study_place(farm, name)}; {trials} trials, "
                 f"{parallel} at once, scored by {metric}; runs and logs in {sweep_dir}/")
            live = Live(console=console, auto_refresh=False) if console.is_terminal else None

            def on_change(current):
                if live is not None:
                    live.update(trials_table(current, f"sweep {name}"), refresh=True)

            def on_end(run):
                write_trials_csv(study, sweep_dir / "trials.csv", params, secret)
                if live is None:
                    click.echo(trial_line(run))
                    sys.stdout.flush()

            sweep = Sweep(study, params, child_args, metric, sweep_dir, env, trials, parallel, on_change, on_end,
                          total_steps=cfg.total_steps)
            if live is not None:
                live.start()
            try:
                runs = sweep.run()
            finally:
                if live is not None:
                    live.stop()
                runs = sweep.runs
                write_trials_csv(study, sweep_dir / "trials.csv", params, secret)
                best, skipped = write_best(study, base, metric, sweep_dir / "best.toml", params, secret)
    except KeyboardInterrupt:
        click.echo(f"rlfarm: interrupted; every trial's trainer stopped{'' if farm.url else ', and the embedded workers and Redis'}"
                   f" (running trials marked FAIL); trials so far in {sweep_dir / 'trials.csv'}", err=True)
        sys.exit(130)
    if live is None:
        console.print(trials_table(runs, f"sweep {name}"))
    click.echo(f"trials: {sweep_dir / 'trials.csv'}")
    for trial, problem in skipped:  # the study is data: what is not the space's, or not signed, is named
        click.echo(f"rlfarm: warning: {skipped_line(trial, problem)}", err=True)
    if best is not None:
        params_text = ", ".join(f"{k}={v}" for k, v in best.params.items())
        click.echo(f"best: trial {best.number}, {metric} {best.value:.2f} ({params_text}); its config: "
                   f"{sweep_dir / 'best.toml'} (rlfarm train --preset {sweep_dir / 'best.toml'})")
    else:
        click.echo("no trial completed: no best.toml")
    failed = [run.number for run in runs if run.state == "FAIL"]
    refused = [run.number for run in runs if run.state == "REFUSED"]
    if failed:
        fail(f"trial{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} failed (reasons in "
             f"trials.csv and {sweep_dir}/logs/); the others ran", 1)
    if refused:
        fail(f"trial{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} refused: params not in "
             f"the space (reasons in trials.csv); the others ran", 1)
    _exit_now()


@main.command()
def presets() -> None:
    """List the shipped presets, one line each."""
    from rlfarm.config import preset_description, preset_names

    for name in preset_names():
        click.echo(f"{name:<16} {preset_description(name)}")


def entry() -> None:
    """The `rlfarm` console script: `main` with a fast exit after a finished run."""
    global _FAST_EXIT
    _FAST_EXIT = True
    main()


if __name__ == "__main__":
    entry()

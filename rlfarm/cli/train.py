"""`rlfarm train`: one run (rlfarm.api), or with --seeds one run per seed (rlfarm.tune.seeds); `rlfarm
presets`, the presets it takes (rlfarm.config)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from rlfarm.cli.common import (
    METRICS_HELP,
    REDIS_HELP,
    SeedList,
    exit_code,
    exit_now,
    fail,
    log,
    metrics_listen,
    sigterm_to_interrupt,
)
from rlfarm.sections import bounds as B  # pure and light: the upper bounds of the options below


def _modes_help() -> str:
    """What each algorithm's modes mean, from the algorithms' own declarations (rlfarm.config)."""
    from rlfarm.config import ALGORITHMS

    per_algo = "; ".join(
        f"{name}: " + ", ".join(f"{mode} ({meaning})" for mode, meaning in section.modes.items())
        for name, section in sorted(ALGORITHMS.items())
    )
    return f"How tasks are scheduled (default: the preset's). {per_algo}."


@click.command()
@click.option(
    "--preset",
    default="cartpole-ppo",
    show_default=True,
    help="Preset name (see `rlfarm presets`) or path to a TOML file.",
)
@click.option("--env", "env_id", help="Gymnasium env id or 'module:callable' (overrides the preset).")
@click.option("--mode", type=click.Choice(["sync", "async"]), help=_modes_help())
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config key, e.g. --set ppo.learning_rate=1e-3 (repeatable).",
)
@click.option(
    "--redis",
    "redis_url",
    help=REDIS_HELP + " None of these: an embedded Redis and local workers are started for the run.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1, max=B.MAX_WORKERS),
    help=f"Worker processes for the embedded default (at most {B.MAX_WORKERS}).",
)
@click.option(
    "--share",
    type=click.FloatRange(min=0, min_open=True),
    metavar="W",
    help="This run's weight on a farm shared with other runs (farm.share, default 1): the "
    "farm's worker processes are divided among the runs training at once in proportion "
    "to their weights; one that needs fewer leaves the rest to the others.",
)
@click.option("--total-steps", type=click.IntRange(min=1), help="Env steps to train for.")
@click.option(
    "--target-return",
    type=float,
    help="Stop early once this return is reached: by the greedy evaluation when evaluations "
    "run (eval.interval > 0), else by the mean of the last 20 training episodes.",
)
@click.option("--seed", type=int, help="Run seed: same seed, same policy, whatever the worker count.")
@click.option("--run-id", help="Name of the run in Redis and under --logdir (default: generated).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="Trainer device (workers: CPU).")
@click.option("--logdir", type=click.Path(file_okay=False), help="Parent of the run directory [runs].")
@click.option(
    "--resume",
    "resume",
    metavar="RUN",
    help="Continue a run whose trainer died, from its checkpoint: a run directory, or a run id "
    "under --logdir. Takes the run's own config; --total-steps, --target-return, "
    "--workers, --device and --redis may change.",
)
@click.option(
    "--if-exists",
    type=click.Choice(["error", "resume"]),
    default="error",
    show_default=True,
    help="When --run-id names a run that already has a checkpoint under --logdir: refuse, or "
    "resume it (what a restarted trainer service wants).",
)
@click.option(
    "--seeds",
    type=SeedList(),
    help=f"Train one run per seed on one farm (e.g. 1-5 or 1,2,3; at most {B.MAX_SEEDS:,} seeds), "
    "--parallel at a time: run ids RUN_ID-s<seed>, each trainer its own process; prints each "
    "seed's best and final greedy evaluation and training return with mean ± std, and writes "
    "LOGDIR/RUN_ID-seeds/summary.json. Without --redis one embedded farm serves them all.",
)
@click.option(
    "--parallel",
    type=click.IntRange(min=1, max=B.MAX_PARALLEL_TRAINERS),
    help=f"With --seeds: trainers running at once; the next seed starts when one ends [this "
    f"machine's cores, at least 2; at most {B.MAX_PARALLEL_TRAINERS}].",
)
@click.option(
    "--metrics-port",
    "metrics_port",
    metavar="[HOST:]PORT",
    help=METRICS_HELP.format(
        what="the run's env steps, SPS, tasks wanted, in flight and held, policy version and "
        "lag, results, re-sends, policy fetches and bytes, Redis outages, the broker's "
        "queue"
    ),
)
@click.option(
    "--capture-video",
    is_flag=True,
    help="Record one greedy episode of each evaluated version to RUN_DIR/videos/*.mp4, in the "
    'trainer (CleanRL\'s --capture-video; needs moviepy: pip install -e ".[video]").',
)
@click.option(
    "--track",
    is_flag=True,
    help="Log the run to MLflow (CleanRL's --track): config as params, progress.csv's metrics at "
    'env steps, best and final policies as artifacts (pip install -e ".[track]").',
)
@click.option(
    "--track-uri",
    metavar="URI",
    help="MLflow tracking URI for --track (implies it) [env MLFLOW_TRACKING_URI, else ./mlruns].",
)
@click.option("--track-experiment", metavar="NAME", help="MLflow experiment for --track (implies it) [rlfarm].")
@click.pass_context
def train(
    ctx: click.Context,
    preset: str,
    env_id: str | None,
    mode: str | None,
    overrides: tuple[str, ...],
    redis_url: str | None,
    workers: int | None,
    share: float | None,
    total_steps: int | None,
    target_return: float | None,
    seed: int | None,
    run_id: str | None,
    device: str | None,
    logdir: str | None,
    resume: str | None,
    if_exists: str,
    seeds: list[int] | None,
    parallel: int | None,
    metrics_port: str | None,
    capture_video: bool,
    track: bool,
    track_uri: str | None,
    track_experiment: str | None,
) -> None:
    """Train a policy on the farm and save it under LOGDIR/RUN_ID.

    Writes config.json, progress.csv, episodes.csv, TensorBoard scalars, a trainer checkpoint (for
    --resume) and final_policy.safetensors.
    """
    if parallel is not None and not seeds:
        fail("--parallel is how many seeds train at once; give it with --seeds")
    if seeds:
        if metrics_port:  # one port, several trainers
            fail(
                "--metrics-port serves one trainer's metrics and --seeds starts one trainer per seed; "
                "train the seeds without it (rlfarm worker --metrics-port and rlfarm status --json "
                "show the farm)"
            )
        from rlfarm.cli.seeds import train_seeds

        train_seeds(ctx, seeds)
        return
    listen = metrics_listen(metrics_port)
    from rlfarm import config as C
    from rlfarm.api import (
        check_config,
        check_extras,
        check_new_run,
        make_config,
        resume_config,
        run_length_notes,
        with_run_id,
    )
    from rlfarm.errors import EnvError, RunExists
    from rlfarm.farm.find import find_farm as train_farm
    from rlfarm.trainer import resume as checkpoint

    auto_resume = False
    if not resume and run_id and if_exists == "resume":
        existing = Path(logdir or C.RunConfig.logdir) / run_id
        if checkpoint.path_in(existing).is_file():
            click.echo(
                f"rlfarm: run {run_id} already exists in {existing.parent}/: resuming it "
                f"with its own config (--if-exists resume)",
                err=True,
            )
            resume, auto_resume = run_id, True
    try:
        if resume and not auto_resume:
            fixed = [
                name
                for name in ("preset", "env_id", "mode", "overrides", "seed", "run_id")
                if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
            ]
            if fixed:
                flags = {
                    "preset": "--preset",
                    "env_id": "--env",
                    "mode": "--mode",
                    "overrides": "--set",
                    "seed": "--seed",
                    "run_id": "--run-id",
                }
                opts = ", ".join(flags[n] for n in fixed)
                raise C.ConfigError(f"--resume continues a run with its own config; {opts} cannot change it")
        if resume:
            cfg = resume_config(
                resume,
                logdir,
                workers=workers,
                total_steps=total_steps,
                target_return=target_return,
                device=device,
                farm__share=share,
            )
        else:
            cfg = make_config(
                preset,
                overrides,
                env=env_id,
                mode=mode,
                workers=workers,
                farm__share=share,
                total_steps=total_steps,
                target_return=target_return,
                seed=seed,
                run_id=run_id,
                device=device,
                logdir=logdir,
            )
        # The trainer takes the farm's secret from the Farm (rlfarm.api.run), not from RLFARM_SECRET,
        # which signs the run directory's files. Farm(None): the embedded default.
        farm = train_farm(redis_url)
        check_config(cfg)
        tracking = check_extras(cfg, capture_video, track_uri or track, track_experiment)
    except (C.ConfigError, EnvError) as exc:
        fail(str(exc), exit_code(exc))  # MissingPackage: 1, as `rlfarm eval --video` says it too
    for level, note in run_length_notes(cfg):  # iterations rounded up; episodes longer than a task
        log.log(level, "%s", note)
    cfg = with_run_id(cfg)
    run_dir = Path(cfg.logdir) / cfg.run_id
    try:
        if not resume:
            check_new_run(cfg)
    except RunExists as exc:
        fail(
            f"run {exc.run_id} already exists in {exc.run_dir.parent}/; continue it with --resume "
            f"{exc.run_id}, or choose another --run-id"
        )
    sigterm_to_interrupt()
    try:
        result = _train(cfg, farm, resume=bool(resume), metrics=listen, capture_video=capture_video, tracking=tracking)
    except KeyboardInterrupt as stop:
        line = _interrupted(farm, cfg, run_dir, getattr(stop, "rlfarm_env_steps", None))
        if not farm.url:  # only the embedded default owns (and has now stopped) its workers and Redis
            line = line.replace("rlfarm: interrupted", "rlfarm: interrupted; workers and Redis stopped", 1)
        click.echo(line, err=True)
        sys.exit(130)
    evaluated = (
        ""
        if result.eval_mean_return != result.eval_mean_return
        else (f", greedy evaluation of the final policy {result.eval_mean_return:.1f}")
    )
    click.echo(
        f"run {result.run_id}: {result.env_steps} env steps in {result.wall_seconds:.1f} s, "
        f"policy v{result.final_version}, mean return of the last 20 training episodes "
        f"{result.rolling_return:.1f} (best {result.best_rolling_return:.1f}, while exploring){evaluated}"
    )
    if result.best_policy is not None:
        target = (
            ""
            if math.isinf(cfg.target_return)
            # a run without a target has none to reach
            else (f"; target {cfg.target_return:g} {'reached' if result.target_reached else 'not reached'}")
        )
        click.echo(
            f"best policy: v{result.best_version}, greedy evaluation {result.best_eval_mean_return:.1f} "
            f"(best_policy.safetensors){target}"
        )
    click.echo(f"saved to {run_dir}/ (final_policy.safetensors sha256 {result.policy_sha256[:16]})")
    exit_now()


def _interrupted(farm, cfg, run_dir: Path, env_steps: int | None) -> str:
    """The line for a run stopped by Ctrl-C, on any farm: how to continue it from its checkpoint, and
    how many env steps, collected since that checkpoint, the resumed run collects again (a checkpoint
    is written at a published version, every farm.checkpoint_interval seconds)."""
    import shlex

    from rlfarm.config import RunConfig
    from rlfarm.farm.connection import redact
    from rlfarm.trainer import resume as checkpoint

    if not checkpoint.path_in(run_dir).is_file():
        return (
            f"rlfarm: interrupted before run {cfg.run_id} saved its first checkpoint, nothing to "
            f"resume; to start it again under that id, remove {run_dir}/ and run "
            f"`rlfarm checkpoints delete {cfg.run_id}`"
        )
    command = f"rlfarm train --resume {cfg.run_id}"
    if Path(cfg.logdir) != Path(RunConfig.logdir):
        command += f" --logdir {shlex.quote(cfg.logdir)}"
    if farm.url and (farm.source or "").startswith("--redis"):  # RLFARM_REDIS_URL, the up farm: found again
        command += f" --redis {shlex.quote(redact(farm.url))}"  # password masked: retype it
    saved = checkpoint.saved_steps(run_dir)
    where = f" from its checkpoint at {saved:,} env steps" if saved is not None else ""
    if saved is not None and env_steps is not None:
        where += f" ({max(env_steps - saved, 0):,} of the {env_steps:,} done are collected again)"
    return f"rlfarm: interrupted; run {cfg.run_id} can continue{where} with: {command}"


def _train(cfg, farm, resume: bool = False, metrics: tuple[str, int] | None = None, **extras):
    """rlfarm.api.run, with every failure it can meet turned into one line and an exit status."""
    from rlfarm.api import run
    from rlfarm.errors import RedisUnavailable, RunDirError
    from rlfarm.farm.connection import redact
    from rlfarm.farm.outage import is_oom
    from rlfarm.runio.logs import log_fatal

    def fatal(message: str, code: int = 2) -> NoReturn:  # noqa: F821
        log_fatal(Path(cfg.logdir) / cfg.run_id, message)  # the console's last line, in the run's log too
        fail(message, code)

    try:  # start-up notes go through logging: `rlfarm: ...` on stderr, hidden by -q
        return run(cfg, farm.url, resume=resume, notify=log.info, metrics=metrics, farm=farm, **extras)
    except Exception as exc:  # noqa: BLE001 - each of rlfarm's errors is one line with its exit status
        code = exit_code(exc)
        if isinstance(exc, RunDirError):  # disk full, directory read-only: files are whole, the checkpoint too
            fatal(
                f"{exc}; the run stopped with its last checkpoint whole: make room (or make "
                f"{exc.path.parent} writable), then rlfarm train --resume {cfg.run_id}",
                code,
            )
        if isinstance(exc, RedisUnavailable):
            fatal(f"{exc}; the run can continue once Redis is back: rlfarm train --resume {cfg.run_id}", code)
        if code is not None:  # RunInUse, ClaimLost: into this process's own run log only, never the other's
            fatal(str(exc), code)
        if not is_oom(exc):  # a bug: its traceback
            raise
        fatal(
            f"Redis at {redact(farm.url or 'the embedded Redis')} is full (maxmemory reached, it "
            f"refuses writes): free memory (e.g. `rlfarm checkpoints delete` old runs) or raise its "
            f"maxmemory; then rlfarm train --resume {cfg.run_id}",
            1,
        )


@click.command()
def presets() -> None:
    """List the shipped presets, one line each."""
    from rlfarm.config import preset_description, preset_names

    for name in preset_names():
        click.echo(f"{name:<16} {preset_description(name)}")

"""`rlfarm train --seeds`: the options a seed's trainer gets, the checks, then rlfarm.tune.seeds (one
farm, a trainer subprocess per seed) and the table."""

from __future__ import annotations

import sys

import click

from rlfarm.cli.common import (
    fail,
    find_farm,
    log,
    sigterm_to_interrupt,
)

# Options of `train` a seed's trainer does not get as given: --seeds makes its own --seed, --run-id and
# --logdir, --parallel is the parent's, the farm (--redis, --workers) is the one started for all the
# seeds, and --resume is refused.
SEEDS_OWN = {"seeds", "parallel", "seed", "run_id", "logdir", "redis_url", "workers", "resume"}


def passed_through(ctx: click.Context, own: set[str]) -> list[str]:
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


def train_seeds(ctx: click.Context, seeds: list[int]) -> None:
    """`rlfarm train --seeds`: checks first, then rlfarm.tune.seeds (one farm, a trainer subprocess
    per seed), then the table."""
    from rich.console import Console

    from rlfarm import config as C
    from rlfarm.api import check_config, check_extras, check_new_run, make_config, with_run_id
    from rlfarm.config.seeds import compact_seeds
    from rlfarm.errors import EnvError, RunExists
    from rlfarm.tune import seeds as S

    p = ctx.params
    for name, flag in (("seed", "--seed"), ("resume", "--resume")):
        if p.get(name) is not None:
            fail(f"--seeds runs one run per seed; it cannot be combined with {flag}")
    try:
        cfg = make_config(
            p["preset"],
            p["overrides"],
            env=p["env_id"],
            mode=p["mode"],
            workers=p["workers"],
            total_steps=p["total_steps"],
            target_return=p["target_return"],
            seed=seeds[0],
            run_id=p["run_id"],
            device=p["device"],
            logdir=p["logdir"],
        )
        check_config(cfg)
        check_extras(cfg, p["capture_video"], p["track_uri"] or p["track"], p["track_experiment"])
        base = with_run_id(cfg).run_id
        for seed in seeds:
            check_new_run(make_config(None, base=cfg, run_id=S.seed_run_id(base, seed)))
    except RunExists as exc:
        fail(f"run {exc.run_id} already exists in {exc.run_dir.parent}/; choose another --run-id")
    except (C.ConfigError, EnvError) as exc:
        fail(str(exc))
    seeds_dir = S.make_seeds_dir(cfg, base)
    farm = find_farm(p["redis_url"], needed=False)
    parallel = S.trainers_at_once(len(seeds), p["parallel"])
    sigterm_to_interrupt()
    try:
        summary, path = S.train_seeds(
            passed_through(ctx, SEEDS_OWN), seeds, cfg, base, seeds_dir, farm, parallel, notify=log.info
        )
    except S.StartFailed as exc:  # one line, not fork's traceback; the farm is stopped by now
        fail(
            f"{exc}; this machine's process limit (ulimit -u, a container's pids limit) or memory is "
            f"reached: lower --parallel (it was {parallel})",
            1,
        )
    except KeyboardInterrupt:
        click.echo(
            "rlfarm: interrupted; every seed's trainer stopped"
            + ("" if farm.url else ", and the embedded workers and Redis"),
            err=True,
        )
        sys.exit(130)
    Console(width=None if sys.stdout.isatty() else 160).print(S.table(summary))
    click.echo(f"summary of {len(seeds)} seeds written to {path}")
    if summary["failed"]:
        fail(
            f"seed{'s' if len(summary['failed']) > 1 else ''} {compact_seeds(summary['failed'])} "
            f"failed (see {seeds_dir}/s<seed>.log); the others finished",
            1,
        )

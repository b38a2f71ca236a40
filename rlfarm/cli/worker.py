"""`rlfarm worker`: a Celery worker with rlfarm's defaults, adding this machine's cores to a farm."""

from __future__ import annotations

import os

import click

from rlfarm.cli.common import METRICS_HELP, REDIS_HELP, allowed_env_modules, fail, find_farm, metrics_listen
from rlfarm.sections import bounds as B  # pure and light: the upper bounds of the options below


@click.command()
@click.option(
    "--redis",
    "redis_url",
    help=REDIS_HELP + " A farm's Redis needs a password, redis://:PASSWORD@host:6379/0 (a "
    "warning says so when a Redis on another address lets this worker in without one).",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1, max=B.MAX_WORKERS),
    default=min(os.cpu_count() or 1, B.MAX_WORKERS),
    show_default=True,
    help=f"Rollout processes on this machine (one torch thread each; at most {B.MAX_WORKERS}).",
)
@click.option("-n", "--hostname", default=None, help="Celery node name [rlfarm-<pid>@<host>].")
@click.option(
    "-l",
    "--loglevel",
    default="INFO",
    show_default=True,
    help="Celery log level [WARNING with rlfarm -q, DEBUG with rlfarm -v].",
)
@click.option(
    "-E",
    "--events/--no-events",
    default=False,
    show_default=True,
    help="Send task events, for Flower (about 1.5 ms per task).",
)
# Into this process's environment before Celery starts, so the worker's pool processes inherit it
# (rlfarm.envs reads it when it builds an env).
@click.option(
    "--allow-env-module",
    "allow_env_module",
    multiple=True,
    metavar="MODULE",
    expose_value=False,
    callback=lambda ctx, param, value: os.environ.update(allowed_env_modules(value)),
    help="Let this worker build 'MODULE:callable' envs (and MODULE's submodules') named by a "
    "run's metadata in Redis; repeatable; added to env RLFARM_ALLOWED_ENV_MODULES. "
    "Registered gymnasium ids need no permission.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="Hard limit in seconds on any task's run time here, whatever the run asks (0: the "
    "run's own, farm.task_time_limit): a stuck process is killed and replaced.",
)
@click.option(
    "--redis-outage-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=300,
    show_default=True,
    help="Seconds a task waits out a Redis outage before it gives up.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=10,
    show_default=True,
    help="On SIGTERM (a spot instance's notice, docker stop) running tasks are handed back at "
    "once, for their trainer to send again; a process that has not let go of its task "
    "after this many seconds (an env stuck in C code) is killed, and the worker exits.",
)
@click.option(
    "--metrics-port",
    "metrics_port",
    metavar="[HOST:]PORT",
    help=METRICS_HELP.format(
        what="this worker's slots, busy slots, tasks, policy fetches and their bytes, Redis outages"
    ),
)
@click.pass_context
def worker(
    ctx: click.Context,
    redis_url: str | None,
    concurrency: int,
    hostname: str | None,
    loglevel: str,
    events: bool,
    time_limit: float,
    redis_outage_timeout: float,
    shutdown_grace: float,
    metrics_port: str | None,
) -> None:
    """Run a Celery worker with rlfarm's defaults: add this machine's cores to a farm.

    Tasks hold a lease in Redis while they run, so a trainer notices within seconds when this worker
    dies; a task past its hard time limit (a hung env) is killed, its process replaced, and the
    trainer told. A Redis restart is waited out. On SIGTERM running tasks are handed back to their
    trainers at once and the worker exits within --shutdown-grace seconds.
    """
    import logging

    from rlfarm.core.signing import secret_from_env
    from rlfarm.errors import RedisAuthError
    from rlfarm.farm.connection import connect, eviction_error, no_password_warning, no_secret_warning
    from rlfarm.farm.find import describe
    from rlfarm.runio import logs

    listen = metrics_listen(metrics_port)
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
    logging.getLogger("rlfarm.worker").info("farm: %s", describe(farm))  # reached: a failure stays one line
    for warning in (
        no_password_warning(redis_url),  # it let us in without one
        no_secret_warning(redis_url, secret_from_env()),
    ):
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
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Celery's own warning is six lines (issue 51)
        import warnings

        from celery.exceptions import SecurityWarning

        warnings.filterwarnings("ignore", category=SecurityWarning)
        logging.getLogger("rlfarm.worker").warning(
            "running as root: Celery allows it because this worker accepts no pickle, but the envs its "
            "tasks build run with root's rights; run workers as an unprivileged user"
        )
    # Without gossip and mingle: rlfarm needs neither, and kombu's gossip teardown during a Redis
    # restart can kill the worker's main process ('NoneType' object has no attribute 'hostname').
    app.start(
        [
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "-O",
            "fair",
            "--loglevel",
            loglevel,
            "--without-gossip",
            "--without-mingle",
            "--hostname",
            hostname or f"rlfarm-{os.getpid()}@%h",
            *(["-E"] if events else []),
        ]
    )
    restart_after_unrecoverable()


RESTARTS_ENV = "RLFARM_WORKER_RESTARTS"
MAX_RESTARTS = 20  # in a row without a task finished between: past them the error is this machine's


def restart_after_unrecoverable() -> None:
    """Celery stops a worker whose consumer met an error it cannot recover from (logged "Unrecoverable
    error", exit code 1), and nothing starts it again outside a supervisor: its runs waited for it
    forever. Without a signal having asked it to stop, the worker starts anew in this process (exec):
    its pool finished its tasks first, and one whose ack was lost runs again (a copy its trainer
    skips or drops)."""
    import sys

    from rlfarm.worker import hooks

    if not hooks.stopped_by_itself():
        return
    restarts = int(os.environ.get(RESTARTS_ENV, "0") or 0)
    if restarts >= MAX_RESTARTS:
        fail(f"the worker stopped on an unrecoverable error {restarts + 1} times in a row; not starting it again", 1)
    os.environ[RESTARTS_ENV] = str(restarts + 1)
    click.echo(
        "rlfarm worker: the worker stopped on an error it cannot recover from (above); "
        f"starting it again ({restarts + 1} of at most {MAX_RESTARTS} in a row)",
        err=True,
    )
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "rlfarm.cli", *sys.argv[1:]])

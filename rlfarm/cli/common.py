"""What every command of the `rlfarm` CLI shares: errors as one line with the exit status of one table
(`exit_code`; the errors: rlfarm.errors), the farm a command works on,
parameter types, the signals that stop a run, and the options' help texts."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import click

REDIS_HELP = (
    "Redis URL of the farm (broker, results and policy store). Omitted: env RLFARM_REDIS_URL, "
    "else the local farm of `rlfarm up` (with its secret). Through Redis Sentinel: "
    "sentinel://h1:26379;sentinel://h2:26379/0?master_name=NAME."
)
RUN_FARM_HELP = REDIS_HELP + (
    " No farm found that way: the run's own embedded Redis (runs/RUN/cluster.json) while it trains."
)
METRICS_HELP = (
    "Serve Prometheus metrics at http://HOST:PORT/metrics: {what}. A bare PORT listens on "
    "127.0.0.1; 0.0.0.0:PORT lets a Prometheus on another machine scrape it."
)

# The logger of the CLI's own notes and warnings (its name is in RUN_DIR/rlfarm.log's lines).
log = logging.getLogger("rlfarm.cli")

# Set by the console script only (not when `main` is called in-process, e.g. by click's test runner).
_FAST_EXIT = False


def exit_now() -> None:
    """After a finished run, skip the interpreter's teardown of torch, TensorBoard and Celery
    (about a second on 2 cores): everything is written and flushed by then."""
    if _FAST_EXIT:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)


def exit_code(exc: BaseException) -> int | None:
    """The exit status a command ends with for `exc`, from one table (None: not one of rlfarm's, a
    bug: its traceback is shown). 2: what the user typed or configured is wrong; 1: the run or the farm
    failed, or this machine lacks something, though nothing typed was wrong."""
    from rlfarm import errors as E

    codes: dict[type[BaseException], int] = {
        E.ConfigError: 2,  # a preset, key or value (VideoError, TrackingError: a setting not possible here)
        E.EnvError: 2,
        E.CheckpointError: 2,  # --resume of a run whose checkpoint does not fit
        E.RedisAuthError: 2,  # wrong credentials are a usage error, like a bad option
        E.MissingPackage: 1,  # nothing typed was wrong: the machine lacks a package
        E.RolloutError: 1,
        E.TaskLostError: 1,
        E.RedisEvicts: 1,
        E.RedisUnavailable: 1,
        E.RunInUse: 1,
        E.ClaimLost: 1,
        E.RunDirError: 1,
        E.MetricsError: 1,
        ConnectionError: 1,  # Redis unreachable at the start
    }
    for cls in type(exc).__mro__:  # the most specific class named decides (MissingPackage over ConfigError)
        if cls in codes:
            return codes[cls]
    return None


def fail(message: str, code: int = 2) -> NoReturn:  # noqa: F821
    click.echo(f"rlfarm: error: {message}", err=True)
    sys.exit(code)


def find_farm(redis_url: str | None, run_id: str | None = None, needed: bool = True, any_run: bool = False):
    """The farm a command works on (rlfarm.farm.find): --redis, RLFARM_REDIS_URL, the `rlfarm up` farm,
    or the live embedded Redis of the run named. Its secret goes into this process's environment, for
    the worker processes it starts and the signed data it reads; a different RLFARM_SECRET of the user's
    is said in one warning line. `needed`: fail in one line (exit 1) when none is found. `any_run`: with
    no farm named, also the embedded Redis of a run training on this machine (`rlfarm status`)."""
    from rlfarm.config import RunConfig
    from rlfarm.farm.find import find_any_farm, not_found, use_secret
    from rlfarm.farm.find import find_farm as find

    run_dir = Path(RunConfig.logdir) / run_id if run_id else None
    farm = find_any_farm(redis_url) if any_run and run_dir is None else find(redis_url, run_dir)
    if farm.url is None:
        if needed:
            fail(not_found(run_dir), 1)
        return farm
    warning = use_secret(farm)
    if warning:
        log.warning("%s", warning)
    return farm


def sigterm_to_interrupt() -> None:
    """SIGTERM and SIGINT both stop a run cleanly (workers and embedded Redis stopped, exit 130).

    SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler at all."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def metrics_listen(value: str | None) -> tuple[str, int] | None:
    """--metrics-port checked before anything starts: its form, prometheus_client, a free port."""
    if value is None:
        return None
    import socket

    from rlfarm.errors import MetricsError
    from rlfarm.runio.exporter import check_available, parse_listen

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


def allowed_env_modules(modules: tuple[str, ...]) -> dict[str, str]:
    """--allow-env-module (of `rlfarm worker` and `rlfarm up`) checked, one usage line for a name that
    is not a module's; returns the environment of workers allowed to build those modules'
    'MODULE:callable' envs: RLFARM_ALLOWED_ENV_MODULES with them added (empty when none is given)."""
    from rlfarm.envs import ALLOWED_MODULES_VAR, valid_module_name
    from rlfarm.envs import allowed_env_modules as allowed

    bad = [m for m in modules if not valid_module_name(m)]
    if bad:
        fail(f"--allow-env-module {bad[0]!r} is not a module name (like mypkg or mypkg.envs)")
    return {ALLOWED_MODULES_VAR: ",".join(dict.fromkeys([*allowed(), *modules]))} if modules else {}


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
        from rlfarm.config.seeds import parse_seeds
        from rlfarm.errors import ConfigError

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
        from rlfarm.errors import RlfarmError

        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _one_line(exc) from None
        except RlfarmError as exc:  # one a command did not turn into its own line: the table's status
            fail(str(exc), exit_code(exc) or 1)

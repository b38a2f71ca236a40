"""The farm as a whole: `rlfarm up` and `rlfarm down` (rlfarm.local.farm), `rlfarm status`
(rlfarm.commands.status, its --watch loop rlfarm.commands.watch)."""

from __future__ import annotations

import os
import signal
import sys

import click

from rlfarm.cli.common import REDIS_HELP, allowed_env_modules, fail, find_farm, sigterm_to_interrupt
from rlfarm.sections import bounds as B  # pure and light: the upper bounds of the options below


@click.command()
@click.option(
    "-w",
    "--workers",
    type=click.IntRange(min=1, max=B.MAX_WORKERS),
    default=min(os.cpu_count() or 1, B.MAX_WORKERS),
    show_default=True,
    help=f"Worker processes of the local farm (at most {B.MAX_WORKERS}).",
)
@click.option(
    "--allow-env-module",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Let its workers build 'MODULE:callable' envs (repeatable).",
)
@click.option("--flower/--no-flower", default=True, show_default=True, help="Start Flower, the dashboard, on the farm.")
@click.option(
    "--listen",
    metavar="ADDRESS",
    help="Also listen on this address of the machine (0.0.0.0: all), so other machines can join the farm; "
    "up prints the command they type. Default: 127.0.0.1 only.",
)
def up(workers: int, modules: tuple[str, ...], flower: bool, listen: str | None) -> None:
    """Start a local farm that stays up: a Redis on 127.0.0.1 and WORKERS worker processes.

    Until `rlfarm down`, every command without --redis or RLFARM_REDIS_URL uses it: `rlfarm train`
    trains on it and skips the start-up of an embedded Redis and workers, `rlfarm worker` adds
    workers to it, `rlfarm status` shows it. Its URL (with a random password), its RLFARM_SECRET and
    logs are under $RLFARM_HOME (default ~/.cache/rlfarm; local-farm.json, mode 0600).
    """
    from rlfarm.farm.connection import redact
    from rlfarm.local import farm as localfarm

    env = allowed_env_modules(modules)
    if listen is not None:
        listen = _address(listen)
    try:
        state = localfarm.up(workers, extra_env=env, flower=flower, listen=listen)
    except (localfarm.LocalFarmError, OSError) as exc:
        fail(str(exc), 1)
    click.echo(
        f"local farm up: Redis {redact(state['redis_url'])}, {workers} worker process{'es' if workers != 1 else ''}, "
        f"logs in "
        f"{state['logs']}; `rlfarm train` uses it until `rlfarm down`"
    )
    click.echo(
        f"more workers on this machine: `rlfarm worker -c N` (it finds this farm and its secret by "
        f"itself, as status, eval --run, checkpoints and sweep do); its URL and secret, e.g. for "
        f"Flower (RLFARM_REDIS_URL): {localfarm.state_path()} (redis_url, secret)"
    )
    if "flower" in state:
        dash = state["flower"]
        click.echo(f"Flower: {dash['url']} (user {dash['user']}, password {dash['password']}); `rlfarm down` stops it")
    if "join" in state:
        click.echo(
            f"other machines join it with (its password travels in clear text: a private network or VPN, "
            f"docs/deploy.md):\n  {state['join']}"
        )
    else:
        click.echo(
            "other machines: this farm listens on 127.0.0.1 only; `rlfarm up --listen 0.0.0.0` (or an "
            "address of this machine) lets them join, and prints the command they type"
        )


def _address(text: str) -> str:
    """--listen's address: an IPv4 address of this machine, said in one line when it is none."""
    import ipaddress
    import socket

    try:
        address = str(ipaddress.IPv4Address(text))
    except ValueError:
        fail(f"--listen wants an IPv4 address of this machine (or 0.0.0.0 for all), got {text!r}")
    if address != "0.0.0.0":
        try:
            with socket.socket() as probe:
                probe.bind((address, 0))
        except OSError as exc:
            fail(f"--listen {address}: not an address of this machine ({exc.strerror})")
    return address


@click.command()
def down() -> None:
    """Stop the local farm started by `rlfarm up`."""
    from rlfarm.local import farm as localfarm

    pids, joined = localfarm.down()
    click.echo(f"local farm stopped ({len(pids)} processes)" if pids else "no local farm was up")
    if joined:
        click.echo(f"told the workers that joined it to stop: {', '.join(joined)}")


@click.command()
@click.option("--redis", "redis_url", help=REDIS_HELP)
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the snapshot as one JSON object (one per line with --watch)."
)
def status(redis_url: str | None, watch: bool, interval: float, as_json: bool) -> None:
    """Runs, policy versions, trainer heartbeats, workers, queue depth and Redis memory of a farm.

    Its first line says which farm it looked at and how it was found (--json: farm.source)."""
    from rich.console import Console

    from rlfarm.commands import watch as W
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect, eviction_error, redact

    if not interval > 0:  # also rejects NaN
        fail(f"--interval must be a positive number of seconds, got {interval}")
    farm = find_farm(redis_url, any_run=True)  # a run on its embedded default too (no farm named)
    redis_url = farm.url
    try:
        client = connect(redis_url)
    except ConnectionError as exc:  # as `train` and `worker`: 1 unreachable, 2 wrong credentials
        from rlfarm.errors import RedisAuthError

        fail(str(exc), 2 if isinstance(exc, RedisAuthError) else 1)
    evicts = eviction_error(client, redis_url)
    if evicts:  # status only reads: it still shows what is there, after saying why runs would fail
        click.echo(f"rlfarm: warning: {evicts}", err=True)
    app = make_app(redis_url)
    # Piped or redirected, rich would assume 80 columns and squeeze the tables; COLUMNS still wins.
    console = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS", 200)))
    if not watch:
        try:
            W.show(console, W.frame(client, app, redis_url, farm.source, as_json))
        except W.LOST as exc:
            fail(f"lost Redis at {redact(redis_url)}: {exc}", 1)
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored
    sigterm_to_interrupt()
    W.watch(client, app, redis_url, farm.source, as_json, interval, console)

"""`rlfarm checkpoints list|export|delete`: runs and their policy versions in the farm's Redis
(rlfarm.farm.runs, rlfarm.farm.policies.store)."""

from __future__ import annotations

from pathlib import Path

import click

from rlfarm.cli.common import RUN_FARM_HELP, OneLineErrors, PolicyVersion, fail, find_farm


@click.group(cls=OneLineErrors)
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
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.farm.runs import list_runs, run_exists

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
@click.option(
    "--version", type=PolicyVersion(), default="latest", show_default=True, help="Version number or 'latest'."
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True, help="File to write (safetensors).")
def checkpoints_export(redis_url: str | None, run_id: str, version: int | str, output: str) -> None:
    """Write a stored version to a safetensors file (checksum verified), usable with `rlfarm eval`."""
    from rlfarm.errors import PolicyError, RunNotFound, SignatureError
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore

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
@click.option("--force", is_flag=True, help="Delete even while the run's trainer heartbeat says it is running.")
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

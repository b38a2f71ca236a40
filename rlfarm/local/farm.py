"""A persistent local farm: `rlfarm up` starts a Redis and worker processes that outlive the command,
so that repeated `rlfarm train` runs skip the start-up (as `ray start` does); `rlfarm down` stops them.

State lives in `$RLFARM_HOME` (default `~/.cache/rlfarm`): `local-farm.json` (URL with a random
password, the farm's RLFARM_SECRET, pids; mode 0600) and the processes' logs. Everything binds to 127.0.0.1,
and with `--listen ADDRESS` Redis and Flower also listen there, for workers on other machines to join.
Every command finds the farm through that file (rlfarm.farm.find, which reads it: home, state_path, running).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from rlfarm.core.signing import SECRET_ENV, secret_from_env
from rlfarm.errors import LocalFarmError
from rlfarm.farm.find import alive, home, running, state_path
from rlfarm.local.cluster import LOOPBACK, LocalCluster, RedisSpec

FARM_NAME = "rlfarm-local"  # its LocalCluster: its own workers are FARM_NAME-<i>@host


def start_flower(
    redis_url: str, log_dir: Path, env: dict[str, str], address: str = "127.0.0.1"
) -> tuple[subprocess.Popen, int, str]:
    """Flower on the farm (`celery -A tasks flower` on `address`, port 5555 when free), behind a basic
    auth password made here; a session of its own, like the farm's other processes. Returns the
    process, its port and its password."""
    import sys

    from rlfarm.local.cluster import free_port

    try:
        with socket.socket() as probe:
            probe.bind((address, 5555))
        port = 5555
    except OSError:
        port = free_port(address)
    password = secrets.token_urlsafe(12)
    with open(log_dir / "flower.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", f"--address={address}",
                f"--basic-auth=rlfarm:{password}",
            ],
            env={**os.environ, **env, "RLFARM_REDIS_URL": redis_url},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return proc, port, password


ALL_ADDRESSES = "0.0.0.0"


def listen_addresses(listen: str | None) -> tuple[str, ...]:
    """What Redis binds: 127.0.0.1 always (the farm's own processes use it), and `listen` too; all
    addresses already hold 127.0.0.1 (binding both would take its port twice)."""
    if listen in (None, LOOPBACK):
        return (LOOPBACK,)
    return (ALL_ADDRESSES,) if listen == ALL_ADDRESSES else (LOOPBACK, listen)


def joinable_address(listen: str) -> str:
    """The address other machines reach this farm at: `listen` itself, or for all addresses the one
    this machine's default route leaves from (no packet is sent), else its host name's."""
    if listen != ALL_ADDRESSES:
        return listen
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: connecting a UDP socket only picks a route
            return probe.getsockname()[0]
    except OSError:  # no route at all (an isolated namespace): the host name is the best guess
        return socket.gethostname()


def join_command(password: str, address: str, port: int, secret: str) -> str:
    """What another machine types to add workers to this farm: its URL and secret in the environment
    (never on the worker's command line, where `ps` shows them to every user there)."""
    return f"RLFARM_REDIS_URL=redis://:{password}@{address}:{port}/0 RLFARM_SECRET={secret} rlfarm worker"


def up(
    workers: int, extra_env: dict[str, str] | None = None, flower: bool = True, listen: str | None = None
) -> dict[str, Any]:
    """Start the local farm (Redis + one Celery worker with `workers` pool processes, and Flower unless
    `flower` is False), wait until it answers, write its state file and return the state. An already
    running farm is an error. `listen`: an address of this machine (0.0.0.0: all of them) where Redis
    and Flower listen too; the state's `join` is then the command that adds workers from elsewhere."""
    if running() is not None:
        raise LocalFarmError(f"a local farm is already up ({state_path()}); `rlfarm down` stops it")
    log_dir = home() / "local-farm"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Signed by default (rlfarm.core.signing): the user's RLFARM_SECRET, else one made here, kept in the
    # state file (mode 0600, like the password) for `rlfarm train` to use on this farm.
    secret = (secret_from_env() or secrets.token_hex(32).encode()).decode()
    cluster = LocalCluster(
        workers=workers,
        name=FARM_NAME,
        log_dir=log_dir,
        extra_env={**(extra_env or {}), SECRET_ENV: secret},
        detached=True,
        redis=RedisSpec(password=secrets.token_hex(16), data_dir=log_dir, bind=listen_addresses(listen)),
    )
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    env = {**(extra_env or {}), SECRET_ENV: secret}
    dashboard = start_flower(cluster.redis_url, log_dir, env, listen or LOOPBACK) if flower else None
    seen_at = joinable_address(listen) if listen else LOOPBACK
    state = {
        "redis_url": cluster.redis_url,
        "pids": cluster.pids,  # the farm is up while these live (rlfarm.farm.find.running)
        "workers": workers,
        "logs": str(log_dir),
        "started": time.time(),
        "secret": secret,
        **({"flower": {"url": f"http://{seen_at}:{dashboard[1]}", "user": "rlfarm", "password": dashboard[2],
                       "pid": dashboard[0].pid}} if dashboard else {}),
        **({"join": join_command(cluster.password or "", seen_at, cluster.port, secret)} if listen else {}),
    }  # fmt: skip
    path = state_path()
    path.touch(mode=0o600)  # it holds the password
    path.write_text(json.dumps(state) + "\n")
    return state


def down(grace: float = 10.0) -> tuple[list[int], list[str]]:
    """Stop the local farm's processes (by process group: each leads one) and forget it, after telling
    the workers that joined it to stop. Returns the pids stopped ([] when none was up) and the joined
    workers told."""
    path = state_path()
    if not path.is_file():
        return [], []
    state = json.loads(path.read_text())
    pids = [pid for pid in state["pids"] if alive(pid)]
    joined = stop_joined_workers(state["redis_url"], pids)
    flower = state.get("flower", {}).get("pid")
    if flower and alive(int(flower)):
        pids.append(int(flower))
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling interval while they exit
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    path.unlink()
    return pids, joined


def stop_joined_workers(redis_url: str, own: list[int]) -> list[str]:
    """Tell the workers that joined the farm (`rlfarm worker` on this machine or another) to stop,
    before its Redis goes: they would retry it for good. Returns their node names (its own workers,
    stopped by their pids, are not among them)."""
    if not own:
        return []
    try:
        from rlfarm.farm.app import make_app

        app = make_app(redis_url)
        answers = app.control.ping(timeout=1.0) or []
        nodes = sorted(name for answer in answers for name in answer)
        theirs = [n for n in nodes if not n.startswith(f"{FARM_NAME}-")]  # its own: FARM_NAME-<i>@host
        if theirs:
            app.control.broadcast("shutdown", destination=theirs)
        return theirs
    except Exception:  # noqa: BLE001 - Redis already gone: nothing to tell anyone
        return []

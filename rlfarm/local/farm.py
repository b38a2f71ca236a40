"""A persistent local farm: `rlfarm up` starts a Redis and worker processes that outlive the command,
so that repeated `rlfarm train` runs skip the start-up (as `ray start` does); `rlfarm down` stops them.

State lives in `$RLFARM_HOME` (default `~/.cache/rlfarm`): `local-farm.json` (URL with a random
password, the farm's RLFARM_SECRET, pids; mode 0600) and the processes' logs. Everything binds to 127.0.0.1.
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
from rlfarm.farm.find import alive, home, running, state_path
from rlfarm.local.cluster import LocalCluster


class LocalFarmError(RuntimeError):
    pass


FARM_NAME = "rlfarm-local"  # its LocalCluster: its own workers are FARM_NAME-<i>@host


def start_flower(redis_url: str, log_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int, str]:
    """Flower on the farm (`celery -A tasks flower` on 127.0.0.1, port 5555 when free), behind a basic
    auth password made here; a session of its own, like the farm's other processes. Returns the
    process, its port and its password."""
    import sys

    from rlfarm.local.cluster import LOOPBACK, free_port

    try:
        with socket.socket() as probe:
            probe.bind((LOOPBACK, 5555))
        port = 5555
    except OSError:
        port = free_port()
    password = secrets.token_urlsafe(12)
    with open(log_dir / "flower.log", "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", f"--address={LOOPBACK}",
                f"--basic-auth=rlfarm:{password}",
            ],
            env={**os.environ, **env, "RLFARM_REDIS_URL": redis_url},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    return proc, port, password


def up(workers: int, extra_env: dict[str, str] | None = None, flower: bool = True) -> dict[str, Any]:
    """Start the local farm (Redis + one Celery worker with `workers` pool processes, and Flower unless
    `flower` is False), wait until it answers, write its state file and return the state. An already
    running farm is an error."""
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
        password=secrets.token_hex(16),
        data_dir=log_dir,
    )
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    dashboard = start_flower(cluster.redis_url, log_dir, {**(extra_env or {}), SECRET_ENV: secret}) if flower else None
    state = {
        "redis_url": cluster.redis_url,
        "pids": cluster.pids,  # the farm is up while these live (rlfarm.farm.find.running)
        "workers": workers,
        "logs": str(log_dir),
        "started": time.time(),
        "secret": secret,
        **({"flower": {"url": f"http://127.0.0.1:{dashboard[1]}", "user": "rlfarm", "password": dashboard[2],
                       "pid": dashboard[0].pid}} if dashboard else {}),
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

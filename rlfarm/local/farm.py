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
import time
from typing import Any

from rlfarm.core.signing import SECRET_ENV, secret_from_env
from rlfarm.farm.find import alive, home, running, state_path
from rlfarm.local.cluster import LocalCluster


class LocalFarmError(RuntimeError):
    pass


FARM_NAME = "rlfarm-local"  # its LocalCluster: its own workers are FARM_NAME-<i>@host


def up(workers: int, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start the local farm (Redis + one Celery worker with `workers` pool processes), wait until it
    answers, write its state file and return the state. An already running farm is an error."""
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
    state = {
        "redis_url": cluster.redis_url,
        "pids": cluster.pids,
        "workers": workers,
        "logs": str(log_dir),
        "started": time.time(),
        "secret": secret,
    }
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

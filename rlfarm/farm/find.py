"""One way to find the farm, for every command: `--redis`, else RLFARM_REDIS_URL, else the local farm of
`rlfarm up`, else (when a run is named) the embedded Redis of that run if it still lives (and, for
`rlfarm status`, of any run training on its embedded default on this machine).

A farm is found with the secret that goes with it: the `rlfarm up` farm keeps its RLFARM_SECRET in its
state file (written by rlfarm.local.farm, read here), and its workers sign and check with it, so a
trainer or worker that joins it without that secret is refused by them ("task spec is not signed").
The secret comes with the up farm's URL however the URL was given (by itself, or in --redis /
RLFARM_REDIS_URL, as a user who exported it for Flower gives it), and with an embedded run's
`cluster.json` if it carries one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from rlfarm.core.signing import SECRET_ENV

REDIS_ENV = "RLFARM_REDIS_URL"
GIVEN = "--redis"
UP_FARM = "the rlfarm up farm"
TRIED = f"no --redis, no {REDIS_ENV}, no `rlfarm up` farm"


# The `rlfarm up` farm's state file, written by rlfarm.local.farm.up, read here.
def home() -> Path:
    base = os.environ.get("RLFARM_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlfarm"
    return Path(base)


def state_path() -> Path:
    return home() / "local-farm.json"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie answers kill(0) too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped in between: the read fails with ESRCH
        return False


def running() -> dict[str, Any] | None:
    """The local farm's state if it is up (its Redis answers and its processes live), else None."""
    path = state_path()
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    if not all(alive(pid) for pid in state["pids"]):
        return None
    import redis

    from rlfarm.farm.redis_url import client

    try:
        client(state["redis_url"], socket_connect_timeout=1).ping()
    except (redis.RedisError, OSError):
        return None
    return state


@dataclass(frozen=True)
class Farm:
    """A farm's Redis URL, the secret its workers hold (None: not known here) and where it was found,
    in words (`source`: None when no farm was found: `rlfarm train` then starts the embedded default)."""

    url: str | None
    secret: str | None = None
    source: str | None = None
    local_workers: int | None = None  # the `rlfarm up` farm's worker processes, on this machine

    @property
    def up(self) -> bool:
        """The local farm of `rlfarm up`, however its URL was given."""
        return self.local_workers is not None


def not_found(run_dir: Path | None = None) -> str:
    embedded = f", no live embedded Redis of run {run_dir.name} ({run_dir / 'cluster.json'})" if run_dir else ""
    return f"no farm found: {TRIED}{embedded} (start one with `rlfarm up`, or give --redis URL)"


def _address(url: str) -> tuple[str, int, str, str] | None:
    """(host, port, db, password) of a redis:// URL, loopback names made one; None for other forms."""
    try:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            return None
        host = (parts.hostname or "127.0.0.1").lower().rstrip(".")
        port = parts.port or 6379
    except ValueError:
        return None
    if host in ("localhost", "::1"):
        host = "127.0.0.1"
    db = parts.path.strip("/") or "0"
    return host, port, db, unquote(parts.password or "")


def _given(url: str, source: str) -> Farm:
    """A URL given by hand: the up farm's (then with its secret) or another farm's."""
    if state_path().is_file():  # only then is there an up farm to compare with
        up = running()
        if up is not None and _address(url) is not None and _address(url) == _address(up["redis_url"]):
            return Farm(url, up.get("secret") or None, f"{source} ({UP_FARM})", int(up["workers"]))
    return Farm(url, None, source)


def embedded_farm(run_dir: Path) -> Farm | None:
    """The embedded Redis of the run in `run_dir` (its `cluster.json`), if that Redis still answers."""
    path = Path(run_dir) / "cluster.json"
    try:
        state = json.loads(path.read_text())
        url, pids = state["redis_url"], state["pids"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pids or not alive(int(pids[0])):  # the first is its redis-server (LocalCluster.pids)
        return None
    import redis

    from rlfarm.farm.redis_url import client

    try:
        probe = client(url, socket_connect_timeout=1)
        try:
            probe.ping()
        finally:
            probe.close()
    except (redis.RedisError, OSError, ValueError):
        return None
    return Farm(url, state.get("secret") or None, f"run {Path(run_dir).name}'s embedded Redis")


# Runs training on their embedded default now, each a file naming its run directory (rlfarm.api writes
# it while the run lives): how `rlfarm status` with no farm named finds one.
def embedded_registry() -> Path:
    return home() / "embedded"


def register_embedded(run_dir: Path) -> Path:
    """Name this process's embedded run for commands that look for a farm; returns the file to remove."""
    path = embedded_registry() / f"{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_dir": str(Path(run_dir).resolve()), "pid": os.getpid()}) + "\n")
    return path


def live_embedded() -> Farm | None:
    """The embedded Redis of the newest run training on its embedded default on this machine (files of
    trainers that are gone are removed on the way)."""
    try:
        entries = sorted(embedded_registry().glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    for path in entries:
        try:
            entry = json.loads(path.read_text())
            pid, run_dir = int(entry["pid"]), Path(entry["run_dir"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not alive(pid):
            path.unlink(missing_ok=True)
            continue
        farm = embedded_farm(run_dir)
        if farm is not None:
            return farm
    return None


def find_farm(redis_url: str | None, run_dir: Path | None = None, environ: Mapping[str, str] | None = None) -> Farm:
    """The farm a command works on: `redis_url` (--redis), else RLFARM_REDIS_URL of `environ` (default
    os.environ), else the `rlfarm up` farm, else the live embedded Redis of the run in `run_dir`, else
    `Farm(None)` (none: `rlfarm train` starts the embedded default, other commands fail with
    `not_found`)."""
    environ = os.environ if environ is None else environ
    if redis_url:
        return _given(redis_url, GIVEN)
    if environ.get(REDIS_ENV):
        return _given(environ[REDIS_ENV], REDIS_ENV)
    up = running()
    if up is not None:
        return Farm(up["redis_url"], up.get("secret") or None, UP_FARM, int(up["workers"]))
    if run_dir is not None:
        embedded = embedded_farm(run_dir)
        if embedded is not None:
            return embedded
    return Farm(None)


def find_any_farm(redis_url: str | None, environ: Mapping[str, str] | None = None) -> Farm:
    """find_farm for a command that looks at whatever runs (`rlfarm status`): with no farm named and no
    `rlfarm up` farm, the embedded Redis of a run training on its embedded default on this machine."""
    farm = find_farm(redis_url, None, environ)
    if farm.url is None:
        return live_embedded() or farm
    return farm


def secret_mismatch(farm: Farm, environ: Mapping[str, str] | None = None) -> str | None:
    """One warning line when the user's RLFARM_SECRET is not the secret of the farm found, else None."""
    environ = os.environ if environ is None else environ
    own = environ.get(SECRET_ENV, "")
    if farm.secret and own and own != farm.secret:
        return (
            f"your {SECRET_ENV} is not the secret of {farm.source}, which its workers sign and check "
            f"with: using the farm's"
        )
    return None


def use_secret(farm: Farm, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Put the farm's secret in `environ` (default os.environ: this process and the workers it starts
    inherit it). Returns secret_mismatch's warning, if any."""
    environ = os.environ if environ is None else environ
    warning = secret_mismatch(farm, environ)
    if farm.secret:
        environ[SECRET_ENV] = farm.secret
    return warning


def describe(farm: Farm) -> str:
    """`the rlfarm up farm, redis://:***@127.0.0.1:PORT/0`: which farm, password hidden."""
    from rlfarm.farm.connection import redact

    return f"{farm.source}, {redact(farm.url or '')}"

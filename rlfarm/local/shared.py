"""One farm for several trainer processes (`rlfarm train --seeds`, `rlfarm sweep`): the farm found
(rlfarm.farm.find: --redis, RLFARM_REDIS_URL, the local farm of `rlfarm up`), or else ONE embedded
Redis and local workers for the whole command, stopped after it whatever happens (as the embedded
default of a single run is, rlfarm.api.run).

What the trainers need is returned as environment variables (RLFARM_REDIS_URL and, for a farm made
here or by `rlfarm up`, however its URL was given, RLFARM_SECRET): never on a command line, where
`ps` shows it to every user.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rlfarm.core.signing import SECRET_ENV, secret_from_env
from rlfarm.farm.find import REDIS_ENV, UP_FARM, Farm, secret_mismatch
from rlfarm.runio.rundir import write_atomic


@contextmanager
def farm_for_trainers(
    farm: Farm,
    workers: int,
    log_dir: Path,
    name: str,
    worker_env: dict[str, str] | None = None,
    notify: Callable[[str], None] = print,
    warn: Callable[[str], None] = print,
) -> Iterator[dict[str, str]]:
    """Yields the environment the trainers run with. `farm`: the one found (rlfarm.farm.find), or
    Farm(None) to start one here; `worker_env`: more variables for embedded workers (e.g. the
    allowlist of a `module:callable` env)."""
    if farm.url:
        mismatch = secret_mismatch(farm)
        if mismatch:
            warn(mismatch)
        if farm.source == UP_FARM:
            notify(
                f"no --redis given: using the local farm started by `rlfarm up` ({farm.local_workers} worker processes)"
            )
        yield {REDIS_ENV: farm.url, **({SECRET_ENV: farm.secret} if farm.secret else {})}
        return
    from rlfarm.local.cluster import LocalCluster

    secret = (secret_from_env() or secrets.token_hex(32).encode()).decode()  # signed, as a single run is
    log_dir.mkdir(parents=True, exist_ok=True)
    notify(
        f"no --redis given: starting one embedded Redis and a local worker of {workers} rollout "
        f"process{'es' * (workers != 1)} for "
        f"all the runs (logs in {log_dir}/)"
    )
    cluster = LocalCluster(
        workers=workers, name=name, log_dir=log_dir, extra_env={**(worker_env or {}), SECRET_ENV: secret}
    )
    try:
        cluster.start()
        write_atomic(
            log_dir / "cluster.json", json.dumps({"redis_url": cluster.redis_url, "pids": cluster.pids}) + "\n"
        )
        yield {REDIS_ENV: cluster.redis_url, SECRET_ENV: secret}
    finally:
        cluster.stop()

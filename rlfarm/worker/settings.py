"""A worker's settings, read once from the environment: `rlfarm worker` sets them from its options
before Celery starts, a plain `celery -A tasks worker` takes them as they are. Every variable unset
(or empty, except the outage timeout) means its default."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from rlfarm.farm.outage import DEFAULT_LIMIT as DEFAULT_OUTAGE_LIMIT
from rlfarm.farm.policies.machine import policy_share

OUTAGE_TIMEOUT_VAR = "RLFARM_REDIS_OUTAGE_TIMEOUT"  # `rlfarm worker --redis-outage-timeout`
SHUTDOWN_GRACE_VAR = "RLFARM_SHUTDOWN_GRACE"  # `--shutdown-grace`
TASK_TIME_LIMIT_VAR = "RLFARM_TASK_TIME_LIMIT"  # `--time-limit`
METRICS_ADDR_VAR = "RLFARM_METRICS_ADDR"  # `--metrics-port`, as HOST:PORT
DEFAULT_SHUTDOWN_GRACE = 10.0  # seconds from SIGTERM until pool processes still holding a task are killed


def _seconds(name: str, raw: str | float) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds") from None


@dataclass(frozen=True)
class WorkerSettings:
    redis_outage_timeout: float = DEFAULT_OUTAGE_LIMIT  # seconds a task waits out a Redis outage
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    task_time_limit: float = 0.0  # this worker's cap on any task's hard time limit (0: the run's own)
    metrics_addr: str | None = None  # serve the worker's Prometheus metrics there (checked when served)
    policy_share: str = ""  # where the machine's processes share versions ("": the default place)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> WorkerSettings:
        """The settings in `environ`; a value that is not a number raises ValueError naming its variable
        (`rlfarm worker` checks its options before it sets them)."""
        return cls(
            # Set but empty is not "unset" here, as it never was: the worker would not guess a limit.
            redis_outage_timeout=_seconds(OUTAGE_TIMEOUT_VAR, environ.get(OUTAGE_TIMEOUT_VAR, DEFAULT_OUTAGE_LIMIT)),
            shutdown_grace=_seconds(SHUTDOWN_GRACE_VAR, environ.get(SHUTDOWN_GRACE_VAR) or DEFAULT_SHUTDOWN_GRACE),
            task_time_limit=_seconds(TASK_TIME_LIMIT_VAR, environ.get(TASK_TIME_LIMIT_VAR) or 0),
            metrics_addr=environ.get(METRICS_ADDR_VAR) or None,
            policy_share=policy_share(environ),
        )

"""The farm's numbers as the trainer sees them, an object the trainer holds (`Heartbeat`): what it
logs at every log step (`scalars`), what `--metrics-port` exports (`live`), and the run's heartbeat in
Redis (`beat`, `rlfarm:<run>:status`, which `rlfarm status` reads), with the check that Redis has not
begun to evict keys since the run started."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlfarm.farm.app import queue_depth
from rlfarm.farm.connection import eviction_policy
from rlfarm.farm.runs import write_status
from rlfarm.trainer import counters

if TYPE_CHECKING:
    import redis

    from rlfarm.config import RunConfig
    from rlfarm.farm.outage import OutageRetry
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.trainer.channel import TaskChannel

EVICTION_CHECK_SECONDS = 5.0  # how often the trainer looks whether Redis began to evict keys


@dataclass(frozen=True)
class RunProgress:
    """Where the run stands, as the trainer tells the report at each call."""

    env_steps: int
    version: int
    sps: float
    eval_mean_return: float
    dropped_stale: int = 0  # ASYNC: results older than async.max_policy_lag
    policy_evals: Mapping[str, float] = field(default_factory=dict)  # several policies: each one's last eval
    last_logged: Mapping[str, float] = field(default_factory=dict)  # the last log step's metrics


class Heartbeat:
    """The numbers of one run's farm: its task channel's and its Redis client's (`client`, its outage
    clock `retry`), the store's lines and versions; `warn` says that Redis began to evict keys."""

    def __init__(
        self,
        config: RunConfig,
        client: redis.Redis,
        retry: OutageRetry,
        store: PolicyStore,
        channel: TaskChannel,
        warn: Callable[[str], None],
    ):
        self.config, self.client, self.retry, self.store, self.channel = config, client, retry, store, channel
        self.warn = warn
        self.wall_start = time.time()
        self._eviction_seen: str | None = None  # Redis's evicting maxmemory-policy, once warned about
        self._eviction_checked = 0.0

    def scalars(self) -> dict[str, float]:
        """What the farm looks like from here, logged in both modes (and read by `rlfarm status`)."""
        return {
            "farm/tasks_in_flight": self.channel.in_flight,
            "farm/queue_depth": queue_depth(self.client),
            **counters.scalars(self.channel.stats),
            "farm/redis_outages": self.retry.outages,
        }

    def labels(self) -> dict[str, str]:
        cfg = self.config
        return {"run": cfg.run_id, "algo": cfg.algo, "mode": cfg.mode, "env": cfg.env.id}

    def live(self, progress: RunProgress) -> dict[str, Any]:
        """What `rlfarm train --metrics-port` exports (rlfarm.runio.exporter), read from the scrape's
        thread: counters and lengths the trainer keeps anyway, and the last log step's numbers for
        what needs Redis (a command from that thread would race the training thread's outage handling)."""
        d, stats, last = self.channel, self.channel.stats, progress.last_logged
        live = counters.live_counts(stats)  # results, resent, policy_fetches
        version_bytes = len(self.store.own[1]) if self.store.own else 0
        lag = {
            stat: last[key]
            for stat, key in (
                ("mean", "farm/policy_lag"),
                ("min", "farm/policy_lag_min"),
                ("max", "farm/policy_lag_max"),
            )
            if key in last
        }
        return {
            "env_steps": progress.env_steps,
            "sps": progress.sps,
            "policy_version": progress.version,
            "tasks_wanted": d.wants_slots(),
            "tasks_in_flight": d.in_flight,
            "tasks_held": len(d.held),
            "slots_waiting": last.get("farm/slots_waiting"),
            "policy_lag": lag or None,
            **live,
            "results": {**live["results"], "stale": progress.dropped_stale},
            "policy_fetch_bytes": stats.policy_fetches * version_bytes,
            "redis_outages": self.retry.outages,
            "tasks_queued": last.get("farm/queue_depth"),
        }

    def beat(self, state: str, progress: RunProgress, farm: Mapping[str, float] | None = None) -> None:
        """Refresh `rlfarm:<run>:status` (expires by itself when the trainer is gone; the last word,
        any state but running, is kept)."""
        self._check_eviction()
        cfg = self.config
        farm = farm if farm is not None else self.scalars()
        write_status(
            self.client,
            cfg.run_id,
            {
                "state": state,
                "mode": cfg.mode,
                "algo": cfg.algo,
                "env": cfg.env.id,
                "env_steps": progress.env_steps,
                "total_steps": cfg.total_steps,
                "version": progress.version,
                "sps": f"{progress.sps:.1f}",
                "tasks_in_flight": int(farm["farm/tasks_in_flight"]),
                "eval_mean_return": f"{progress.eval_mean_return:.2f}",
                # several policies: each one's in the last evaluation (rlfarm status shows them)
                **({"policy_evals": json.dumps(dict(progress.policy_evals))} if progress.policy_evals else {}),
                **({"lines": json.dumps(self.store.heads)} if self.store.heads else {}),
                "host": socket.gethostname(),
                **({"slots_waiting": f"{farm['farm/slots_waiting']:.3f}"} if "farm/slots_waiting" in farm else {}),
                "pid": os.getpid(),
                "started": f"{self.wall_start:.3f}",
                "updated": f"{time.time():.3f}",
            },
            final=state != "running",
        )

    def _check_eviction(self) -> None:
        """Redis switched to evicting keys mid-run (`CONFIG SET maxmemory-policy allkeys-lru`): the run
        was checked for noeviction at its start only; say so once, every EVICTION_CHECK_SECONDS at most."""
        now = time.monotonic()
        if now < self._eviction_checked + EVICTION_CHECK_SECONDS:
            return
        self._eviction_checked = now
        policy = eviction_policy(self.client)
        if policy is not None and policy != self._eviction_seen:
            self.warn(
                f"Redis now evicts keys when memory runs short (maxmemory-policy {policy}, set since "
                f"this run started): it may drop run {self.config.run_id}'s policies, metadata and "
                f"queued tasks; set it back with `redis-cli CONFIG SET maxmemory-policy noeviction`"
            )
        self._eviction_seen = policy

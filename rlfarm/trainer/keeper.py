"""The trainer as the owner of its run's keys in Redis (`RunKeeper`, which Trainer derives from).

The task channel and the watchdog (rlfarm.trainer.channel, rlfarm.trainer.watchdog) ask the trainer,
as their `RunOwner` (rlfarm.trainer.outbox), to write back what it owns when Redis lost it (a FLUSHALL,
a restart without its data, a failover to a replica behind) or someone else changed it (a forged key,
a refused policy, metadata or spec), to say a warning and to refresh the progress bar. Here too: the
run's heartbeat, and the farm's numbers it logs and exports. The attributes named below are the
trainer's (rlfarm.trainer.base), as are `publish` and `eval_mean_return`.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any

from rlfarm.config import to_dict
from rlfarm.core.protocol import PROTOCOL
from rlfarm.farm.app import queue_depth
from rlfarm.farm.connection import eviction_policy
from rlfarm.farm.runs import write_status
from rlfarm.trainer import counters
from rlfarm.trainer.log import warn

if TYPE_CHECKING:
    import redis

    from rlfarm.config import RunConfig
    from rlfarm.core.protocol import Result
    from rlfarm.envs import SpaceSpec
    from rlfarm.farm.claim import Claim
    from rlfarm.farm.outage import OutageRetry
    from rlfarm.farm.policies.store import PolicyStore
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.trainer.channel import TaskChannel
    from rlfarm.trainer.streams import RunStreams

EVICTION_CHECK_SECONDS = 5.0  # how often the trainer looks whether Redis began to evict keys


class RunKeeper:
    """The RunOwner side of a trainer, its heartbeat and its farm numbers."""

    config: RunConfig
    space: SpaceSpec
    client: redis.Redis
    retry: OutageRetry
    store: PolicyStore
    claim: Claim
    channel: TaskChannel
    streams: RunStreams
    logger: RunLogger | None
    env_steps: int
    version: int
    dropped_stale: int
    wall_start: float
    eval_mean_return: float
    _sps: float
    _last_logged: dict[str, float]
    _eviction_seen: str | None
    _eviction_checked: float

    def publish(self) -> None:
        raise NotImplementedError  # the trainer's (rlfarm.trainer.base)

    # ---- RunOwner: what the task channel and the watchdog ask of the trainer -------------------------
    def warn(self, text: str) -> None:
        warn(text)

    def restore_run_state(self) -> None:
        """The run's metadata vanished from Redis (FLUSHALL, a restart without its data): write back
        what the trainer owns, so workers can go on building the env and fetching the policy."""
        self.warn(
            f"run {self.config.run_id}'s state is gone from Redis (flushed, or restarted without "
            f"its data): writing back its metadata and policy v{self.version}, re-sending lost tasks"
        )
        self.store.set_run_meta(self.run_meta())
        self.store.restore_pinned()  # the best version and those being evaluated
        if self.store.own is not None and self.store.own[0] >= self.version:
            self.store.restore_newest()  # the version it published, from its own copy
        else:
            self.publish()
        self.heartbeat()

    def after_outage(self) -> None:
        """Redis was away and is back. Back as a replica promoted by a Sentinel failover, it may lack
        the newest writes (replication is asynchronous): put back the newest policy version and the
        pinned ones, which tasks sent before the failover may name (the watchdog re-lists its
        pending tasks as wanted and re-sends those lost)."""
        restored = self.store.restore_newest()
        self.store.restore_pinned()
        if restored is not None:
            self.warn(
                f"Redis came back without policy v{restored} of run {self.config.run_id} (a replica "
                f"promoted before it had copied it): wrote it back"
            )

    def run_meta(self) -> dict[str, Any]:
        """What workers read of the run; `incarnation` tells this trainer's run from an earlier one of
        the same id, whose cached metadata and policies a worker must not use."""
        return {
            "config": to_dict(self.config),
            "space": self.space.to_dict(),
            "incarnation": self.claim.incarnation,
            "protocol": PROTOCOL,
        }

    def rewrite_owned(self) -> None:
        """A key of the run was found as the trainer did not write it (rlfarm.farm.guard): put back
        every key it owns from its own copies (metadata, newest and pinned versions, heartbeat)."""
        written = self.store.write_back()
        self.store.restore_newest()
        self.store.restore_pinned()
        self.heartbeat()
        if written:
            self.warn(f"wrote back {' and '.join(written)} of run {self.config.run_id} from the trainer's own copy")

    def write_back(self, kind: str) -> str:
        """A worker refused the run's metadata, a policy or a task spec (rlfarm.trainer.watchdog): put back
        what the trainer wrote, from its own copies, where Redis holds something else."""
        written = self.store.write_back()
        return f"wrote back {' and '.join(written)} from the trainer's own copy; " if written else ""

    def late_copy(self, message: Result) -> None:
        self.streams.late_copy(message)

    def accepted_snapshot(self, message: Result) -> None:
        self.streams.accepted(message)

    def on_event(self) -> None:
        """A task was sent or a result arrived: refresh the progress bar."""
        if self.logger:
            self.logger.status(self.env_steps, self._sps, self.version, self.channel.in_flight)

    # ---- the farm's numbers, logged, exported and in the heartbeat ----------------------------------
    def farm_scalars(self) -> dict[str, float]:
        """What the farm looks like from here, logged in both modes (and read by `rlfarm status`)."""
        stats = self.channel.stats
        return {
            "farm/tasks_in_flight": self.channel.in_flight,
            "farm/queue_depth": queue_depth(self.client),
            **counters.scalars(stats),
            "farm/redis_outages": self.retry.outages,
        }

    def metrics_labels(self) -> dict[str, str]:
        cfg = self.config
        return {"run": cfg.run_id, "algo": cfg.algo, "mode": cfg.mode, "env": cfg.env.id}

    def live_metrics(self) -> dict[str, Any]:
        """What `rlfarm train --metrics-port` exports (rlfarm.runio.exporter), read from the scrape's
        thread: counters and lengths the trainer keeps anyway, and the last log step's numbers for
        what needs Redis (a command from that thread would race the training thread's outage handling)."""
        d, stats, last = self.channel, self.channel.stats, self._last_logged
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
            "env_steps": self.env_steps,
            "sps": self._sps,
            "policy_version": self.version,
            "tasks_wanted": d.wants_slots(),
            "tasks_in_flight": d.in_flight,
            "tasks_held": len(d.held),
            "slots_waiting": last.get("farm/slots_waiting"),
            "policy_lag": lag or None,
            **live,
            "results": {**live["results"], "stale": self.dropped_stale},
            "policy_fetch_bytes": stats.policy_fetches * version_bytes,
            "redis_outages": self.retry.outages,
            "tasks_queued": last.get("farm/queue_depth"),
        }

    def heartbeat(self, state: str = "running", farm: dict[str, float] | None = None) -> None:
        """Refresh `rlfarm:<run>:status` (expires by itself when the trainer is gone; the last word,
        any state but running, is kept)."""
        self._check_eviction()
        cfg = self.config
        farm = farm if farm is not None else self.farm_scalars()
        write_status(
            self.client,
            cfg.run_id,
            {
                "state": state,
                "mode": cfg.mode,
                "algo": cfg.algo,
                "env": cfg.env.id,
                "env_steps": self.env_steps,
                "total_steps": cfg.total_steps,
                "version": self.version,
                "sps": f"{self._sps:.1f}",
                "tasks_in_flight": int(farm["farm/tasks_in_flight"]),
                "eval_mean_return": f"{self.eval_mean_return:.2f}",
                # several policies: each one's in the last evaluation (rlfarm status shows them)
                **({"policy_evals": json.dumps(self.policy_eval_means)} if self.policy_eval_means else {}),
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

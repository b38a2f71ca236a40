"""The run's dispatch counters and their names: each counter is defined once here, with the name it has
in each place it shows (summary.json, the CSV and TensorBoard scalars, `--metrics-port` and `rlfarm
status --json`), and every sink reads this table (`summary_counts`, `scalars`, `live_counts`).

Adding a counter: a field of DispatchStats and one row of COUNTERS. Names differ between sinks only where
they did before the table existed (a metric's name is part of what users read and scripts parse).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlfarm.core.protocol import UNVERIFIED_INPUTS, Key


@dataclass
class DispatchStats:
    dispatched: int = 0
    redispatched: int = 0
    duplicates: int = 0  # results dropped because their key had already counted
    skipped: int = 0  # of the duplicates, copies that workers skipped unrun
    received: int = 0
    accepted: int = 0
    leases_expired: int = 0  # re-sent because the worker running them was lost
    messages_lost: int = 0  # re-sent because their message was neither queued nor running
    time_limits: int = 0  # re-sent because they ran past their hard time limit
    stragglers: int = 0  # backup copies of tasks running longer than task_timeout
    nonfinite: int = 0  # re-sent because their rollout held NaN or infinite rewards
    held: int = 0  # tasks held back for a while because the run had its share of the farm's slots
    forged: int = 0  # results dropped because their signature did not verify (RLFARM_SECRET)
    forged_keys: int = 0  # keys of the run found as the trainer did not write them: refused, written back
    forged_snapshots: int = 0  # env stream snapshots not the blob their signed digest names (restarted)
    # Task inputs workers refused as not signed by the farm (Result.unverified), by kind; re-sent.
    unverified: dict[str, int] = field(default_factory=lambda: dict.fromkeys(UNVERIFIED_INPUTS, 0))
    state_restored: int = 0  # times the run's state was found lost in Redis and written back
    refused: int = 0  # copies refused unrun by workers of another protocol version (re-sent)
    handed_back: int = 0  # copies handed back unfinished by workers shutting down (re-sent at once)
    # Re-sent because their env raised rlfarm.errors.EnvFault, by the fault's name: summary.json's
    # faults.reported (a name an env chose has no fixed CSV column or metric of its own).
    reported: dict[str, int] = field(default_factory=dict)
    receive_seconds: float = 0.0  # trainer CPU time spent decoding results
    policy_fetches: int = 0  # results whose worker fetched its policy version from Redis (not its cache)
    task_ids: dict[Key, list[str]] = field(default_factory=dict)
    # Of the rollouts only: every env step counted comes from exactly one of them (evaluations, which
    # every run has at its end, count in `accepted` but not here).
    accepted_task_ids: list[str] = field(default_factory=list)

    def security(self) -> dict[str, int]:
        """What was refused for want of a valid signature (RLFARM_SECRET), by what it was."""
        return {
            "security/refused_result": self.forged,
            "security/refused_key": self.forged_keys,
            "security/refused_snapshot": self.forged_snapshots,
            **{f"security/refused_{kind}": n for kind, n in self.unverified.items()},
        }


@dataclass(frozen=True)
class Counter:
    """One counter of DispatchStats and its name in each sink (None: not shown there). `summary`:
    a key of summary.json, dotted under a section; `scalar`: the CSV and TensorBoard name; `live`:
    its place in `--metrics-port`'s snapshot and the heartbeat (`group.name`)."""

    field: str
    summary: str | None = None
    scalar: str | None = None
    live: str | None = None


COUNTERS = (
    Counter("dispatched", summary="dispatched"),
    Counter("redispatched", scalar="farm/redispatched"),  # summary: TrainResult.redispatched
    Counter("held", summary="tasks_held"),
    Counter("accepted", live="results.accepted"),
    Counter("duplicates", scalar="farm/results_dropped", live="results.duplicate"),  # summary: TrainResult
    Counter("forged", live="results.forged"),
    Counter("leases_expired", "faults.leases_expired", "farm/leases_expired", "resent.lease_expired"),
    Counter("messages_lost", summary="faults.messages_lost", live="resent.message_lost"),
    Counter("time_limits", summary="faults.time_limits", scalar="farm/time_limits", live="resent.time_limit"),
    Counter("stragglers", summary="faults.stragglers", live="resent.straggler"),
    Counter("nonfinite", summary="faults.nonfinite_results", scalar="farm/nonfinite_results", live="resent.nonfinite"),
    Counter("skipped", summary="faults.skipped_copies"),
    Counter("state_restored", summary="faults.state_restored"),
    Counter("refused", summary="faults.refused", live="resent.refused"),
    Counter("handed_back", summary="faults.handed_back", live="resent.handed_back"),
    Counter("policy_fetches", live="policy_fetches"),
)


def _nested(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        *sections, last = name.split(".")
        place = out
        for section in sections:
            place = place.setdefault(section, {})
        place[last] = value
    return out


def summary_counts(stats: DispatchStats) -> dict[str, Any]:
    """The counters summary.json shows, nested by section ("faults")."""
    counts = _nested([(c.summary, getattr(stats, c.field)) for c in COUNTERS if c.summary])
    counts["faults"]["reported"] = dict(sorted(stats.reported.items()))
    return counts


def scalars(stats: DispatchStats) -> dict[str, float]:
    """The counters logged at every log step (CSV, TensorBoard), the security ones included."""
    return {**{c.scalar: getattr(stats, c.field) for c in COUNTERS if c.scalar}, **stats.security()}


def live_counts(stats: DispatchStats) -> dict[str, Any]:
    """The counters of `--metrics-port`'s snapshot, nested by group ("results", "resent")."""
    return _nested([(c.live, getattr(stats, c.field)) for c in COUNTERS if c.live])

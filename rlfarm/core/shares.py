"""Fair shares of a farm's task slots between the runs training on it at once, pure.

Every trainer registers its run's weight (`farm.share`, `--share W`) and demand (tasks it has to run
now: queued, running or held back) in Redis (rlfarm.farm.shares); each computes the same `allocate`
from what the registry holds and keeps at most its own cap of tasks on the farm. See
docs/architecture.md (decision 19).

Weighted max-min fairness (water-filling): slots are offered in proportion to the weights; a run that
wants less than its offer keeps only what it wants and the rest is offered again to the others
(work-conserving); what remains is split in proportion to the weights, whole slots by largest
remainder.

Over time, not only at each instant: a SYNC run wants nothing while it learns and little at the tail
of a group, so shares kept at each instant left it well under its weight's part of the slot time
(benchmarks/shares.py). Each run's weight is therefore scaled by how far the slot time it got over
the last seconds (rlfarm.farm.shares.CONTROL_WINDOW) fell short of (or exceeded) its weight's part, to the power
`GAIN`: a run owed time gets more slots while it wants them, one ahead gets fewer, and with whole
slots that is what moves the average. A run owed time (or new) always gets one slot at least, so no
run starves; a run ahead of its share may be held to none while others are owed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

GAIN = 4.0  # how strongly a shortfall in slot time raises a run's weight
MAX_FACTOR = 8.0  # and the most it may raise or lower it


@dataclass(frozen=True)
class Demand:
    """One run as the registry holds it: its weight, the tasks it wants on the farm now, and the
    fraction of the farm's slot time its tasks ran over the last control window (None: not known
    yet, a run just started)."""

    weight: float
    tasks: int
    used: float | None = None


def effective_weights(wanting: Mapping[str, Demand]) -> tuple[dict[str, float], set[str]]:
    """Each wanting run's weight scaled by its shortfall in slot time, and the runs owed time (or
    without a record yet), which keep one slot at least."""
    weights = {run: d.weight for run, d in wanting.items()}
    known = {run: d for run, d in wanting.items() if d.used is not None}
    used = sum(d.used for d in known.values())  # type: ignore[misc]
    if len(known) < 2 or used <= 0:
        return weights, set(wanting)
    owed = set(wanting) - set(known)
    total = sum(d.weight for d in known.values())
    for run, d in known.items():
        due, got = d.weight / total, d.used / used  # type: ignore[operator]
        factor = (due / max(got, 1e-9)) ** GAIN
        weights[run] = d.weight * min(MAX_FACTOR, max(1.0 / MAX_FACTOR, factor))
        if got < due:
            owed.add(run)
    return weights, owed


def allocate(slots: int, runs: Mapping[str, Demand]) -> dict[str, int]:
    """Each run's cap on tasks on the farm: sum of caps <= max(slots, runs owed a slot); a run's cap
    never exceeds its demand; ties broken by run id, so every trainer computes the same split."""
    caps = {run: 0 for run in runs}
    wanting = {run: d for run, d in runs.items() if d.tasks > 0 and d.weight > 0}
    if not wanting:
        return caps
    weights, owed = effective_weights(wanting)
    budget = max(slots, len(owed))
    exact = _water_fill(float(budget), {run: (weights[run], d.tasks) for run, d in wanting.items()})
    floor = {run: 1 if run in owed else 0 for run in wanting}
    whole = {run: max(floor[run], min(wanting[run].tasks, math.floor(x + 1e-9))) for run, x in exact.items()}
    # The one slot owed runs never go without may overshoot the budget: taken back from those
    # furthest above their exact share.
    while sum(whole.values()) > budget:
        over = [r for r in whole if whole[r] > floor[r]]
        if not over:
            break
        run = max(over, key=lambda r: (whole[r] - exact[r], r))
        whole[run] -= 1
    left = budget - sum(whole.values())
    order = sorted(wanting, key=lambda run: (-(exact[run] - whole[run]), run))
    for run in order:
        if left <= 0:
            break
        if whole[run] < wanting[run].tasks and exact[run] > whole[run]:
            whole[run] += 1
            left -= 1
    caps.update(whole)
    return caps


def _water_fill(budget: float, wanting: Mapping[str, tuple[float, int]]) -> dict[str, float]:
    """Weighted max-min fair shares of `budget` in real numbers, given (weight, demand) per run: a
    run whose demand fits its proportional offer gets its demand and leaves; the rest split what
    remains by weight."""
    left, share = dict(wanting), {}
    while left:
        total = sum(weight for weight, _ in left.values())
        served = {run: tasks for run, (weight, tasks) in left.items() if tasks <= budget * weight / total}
        if not served:
            share.update({run: budget * weight / total for run, (weight, _) in left.items()})
            break
        for run, tasks in served.items():
            share[run] = float(tasks)
            budget -= tasks
            del left[run]
    return share


def used_fraction(busy_seconds: float, slots: int, window: float) -> float:
    """The share of the farm's slot time a run used: its tasks' running seconds over slots x window."""
    return busy_seconds / (slots * window) if slots > 0 and window > 0 else 0.0

"""Fair shares of a farm's task slots between the runs training on it at once, pure.

Every trainer registers its run's weight (`farm.share`, `--share W`) and demand (tasks it has to run
now: queued, running or held back) in Redis (rlfarm.farm.shares); each computes the same `allocate`
from what the registry holds and keeps at most its own cap of tasks on the farm. See
docs/architecture.md (decision 19).

Weighted max-min fairness (water-filling): slots are offered in proportion to the weights; a run that
wants less than its offer keeps only what it wants and the rest is offered again to the others
(work-conserving); what remains is split in proportion to the weights, whole slots by largest
remainder. Every run with demand gets at least one slot, however many runs share how few slots: no
run starves, the farm is then oversubscribed by at most one task per run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Demand:
    """One run as the registry holds it: its weight and the tasks it wants on the farm now."""

    weight: float
    tasks: int


def allocate(slots: int, runs: Mapping[str, Demand]) -> dict[str, int]:
    """Each run's cap on tasks on the farm: sum of caps <= max(slots, runs with demand); a run's cap
    never exceeds its demand; ties broken by run id, so every trainer computes the same split."""
    caps = {run: 0 for run in runs}
    wanting = {run: d for run, d in runs.items() if d.tasks > 0 and d.weight > 0}
    if not wanting:
        return caps
    budget = max(slots, len(wanting))
    exact = _water_fill(float(budget), wanting)
    whole = {run: max(1, min(wanting[run].tasks, math.floor(x + 1e-9))) for run, x in exact.items()}
    # The one slot no run goes without may overshoot the budget: taken back from those furthest above
    # their exact share (never from a run down to its last slot).
    while sum(whole.values()) > budget:
        run = max((r for r in whole if whole[r] > 1), key=lambda r: (whole[r] - exact[r], r))
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


def _water_fill(budget: float, wanting: Mapping[str, Demand]) -> dict[str, float]:
    """Weighted max-min fair shares of `budget` in real numbers: a run whose demand fits its
    proportional offer gets its demand and leaves; the rest split what remains by weight."""
    left, share = dict(wanting), {}
    while left:
        total = sum(d.weight for d in left.values())
        served = {run: d for run, d in left.items() if d.tasks <= budget * d.weight / total}
        if not served:
            share.update({run: budget * d.weight / total for run, d in left.items()})
            break
        for run, d in served.items():
            share[run] = float(d.tasks)
            budget -= d.tasks
            del left[run]
    return share


def used_fraction(busy_seconds: float, slots: int, window: float) -> float:
    """The share of the farm's slot time a run used: its tasks' running seconds over slots x window."""
    return busy_seconds / (slots * window) if slots > 0 and window > 0 else 0.0

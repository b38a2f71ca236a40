"""Fair shares on a farm that serves several runs at once: the registry in Redis and a trainer's cap.

Admission control by the trainers, one Celery queue (docs/architecture.md, decision 19):
- every rlfarm worker's main process registers its slots (pool processes) in `keys.NODES`, refreshed
  with its lease renewals (rlfarm.worker.main_process.LeaseKeeper), expiring `NODE_SECONDS` after its last;
- every trainer registers its run in `keys.RUNS` with its weight (`farm.share`) and demand (tasks it
  has queued, running or held back) in `keys.share(run)`, refreshed every `HEARTBEAT` seconds from a
  thread of its own (a long update must not let it lapse), expiring `RUN_SECONDS` after its last: a
  run that ends frees its slots at once, one that dies within `RUN_SECONDS`;
- every trainer computes the same `rlfarm.core.shares.allocate` from that snapshot (its own demand as
  it is now) and keeps at most its cap of tasks on the farm (rlfarm.trainer.channel holds the rest).
Expiry times are Redis's clock (TIME), so machines whose clocks differ agree on who is alive.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import redis

from rlfarm.core.shares import Demand, allocate, used_fraction
from rlfarm.farm import keys, redis_url
from rlfarm.farm.guard import delete_wrong_types

HEARTBEAT = 0.25  # seconds between a trainer's registrations: how soon it sees another run want slots
RUN_SECONDS = 3.0  # a run that stopped registering (its trainer died) leaves the split this long after
NODE_SECONDS = 5.0  # a worker whose main process stopped renewing leaves the slot count this long after
USED_WINDOW = 60.0  # `rlfarm status`'s "share used": slot time over the last minute
CONTROL_WINDOW = 20.0  # the slot time each run got over this many seconds steers its share (rlfarm.core.shares)


def server_time(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def register_node(client: redis.Redis, node: str, slots: int, now: float | None = None) -> None:
    """A worker's slots, until NODE_SECONDS from now (called with each lease renewal round)."""
    now = server_time(client) if now is None else now
    client.zadd(keys.NODES, {f"{slots}@{node}": now + NODE_SECONDS})


def live_slots(client: redis.Redis, now: float | None = None) -> int:
    """Pool processes of the rlfarm workers alive now."""
    now = server_time(client) if now is None else now
    members = client.zrangebyscore(keys.NODES, now, "+inf")
    return sum(_slots(m) for m in members)


def live_nodes(client: redis.Redis, now: float | None = None) -> list[str]:
    """Celery node names of the rlfarm workers alive now (each registers with its lease renewals), so a
    broadcast to the workers can stop waiting once each has answered (`rlfarm status`)."""
    now = server_time(client) if now is None else now
    members = [m.decode(errors="replace") for m in client.zrangebyscore(keys.NODES, now, "+inf")]
    return sorted({m.split("@", 1)[1] for m in members if "@" in m and _slots(m.encode())})


def _slots(member: bytes) -> int:
    """The slots a NODES member registers; 0 for one no worker wrote (`<slots>@<node>`, slots 1..4096)."""
    head = member.decode(errors="replace").split("@", 1)[0]
    return int(head) if head.isdigit() and 0 < int(head) <= 4096 else 0


def read_runs(client: redis.Redis, now: float | None = None) -> dict[str, dict[str, str]]:
    """The registered runs alive now, each with its share hash (weight, demand, cap, busy, used...)."""
    now = server_time(client) if now is None else now
    runs = [r.decode() for r in client.zrangebyscore(keys.RUNS, now, "+inf")]
    pipe = client.pipeline(transaction=False)
    for run in runs:
        pipe.hgetall(keys.share(run))
    found = {}
    for run, raw in zip(runs, pipe.execute()):
        if raw:
            found[run] = {k.decode(): v.decode() for k, v in raw.items()}
    return found


def _demand(share: dict[str, str]) -> Demand | None:
    """Another run's registration as numbers; None for one its trainer did not write (not numbers,
    or out of range), which then takes no part in the split."""
    try:
        weight, demand = float(share.get("weight", 1.0)), int(share.get("demand", 0))
        recent = float(share["recent"]) if share.get("recent") else None
    except (TypeError, ValueError):
        return None
    if not (0 < weight <= 1e6 and 0 <= demand <= 10**6) or (recent is not None and not 0 <= recent <= 1e3):
        return None
    return Demand(weight, demand, recent)


class FarmShare:
    """A trainer's registration and cap. `demand()`: tasks it wants on the farm now; `busy()`: the
    seconds its finished tasks ran on workers, so far (what "share used" is measured in)."""

    def __init__(
        self, url: str, run_id: str, weight: float, mode: str, demand: Callable[[], int], busy: Callable[[], float]
    ):
        # Its own client, failing within seconds: during a Redis outage the registration lapses and
        # the cap stays what it was (the trainer's own client waits the outage out).
        self.client = redis_url.client(url, socket_connect_timeout=3, socket_timeout=3)
        self.run_id, self.weight, self.mode = run_id, weight, mode
        self.demand, self.busy = demand, busy
        self.slots = 0
        self.recent: float | None = None  # this run's fraction of the slot time over CONTROL_WINDOW
        self.results_waiting = 0  # finished tasks whose results wait for the trainer: they hold no slot
        self.others: dict[str, Demand] = {}
        self._history: collections.deque[tuple[float, float]] = collections.deque()  # (time, busy)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the cap --------------------------------------------------------------------------------
    def cap(self, demand: int) -> int | None:
        """At most this many of the run's tasks on the farm, given it wants `demand` now. None: no
        limit, when the run is alone on the farm or no rlfarm worker is registered (nothing to
        divide; tasks then wait in the queue as before)."""
        if self.slots <= 0 or not self.others:
            return None  # alone on the farm: its tasks queue as deep as it likes (ASYNC's pipelining)
        runs = {**self.others, self.run_id: Demand(self.weight, demand, self.recent)}
        return allocate(self.slots, runs)[self.run_id]

    # ---- the registry ----------------------------------------------------------------------------
    def refresh(self) -> None:
        """Register (weight, demand, cap, busy seconds, share used), then read the others and the slots.
        A registry key of the wrong type (written by someone else) is deleted and written anew."""
        try:
            self._refresh()
        except redis.ResponseError as exc:
            if "WRONGTYPE" not in str(exc) or not delete_wrong_types(
                self.client, [keys.share(self.run_id), keys.RUNS, keys.NODES]
            ):
                raise
            self._refresh()

    def _refresh(self) -> None:
        now = server_time(self.client)
        demand, busy = self.demand(), self.busy()
        self._history.append((now, busy))
        while len(self._history) > 2 and self._history[1][0] <= now - USED_WINDOW:
            self._history.popleft()
        self.recent = self._used_since(now - CONTROL_WINDOW, now, busy)
        cap = self.cap(demand)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(
            keys.share(self.run_id),
            mapping={
                "weight": repr(self.weight),
                "demand": demand,
                "mode": self.mode,
                "cap": "" if cap is None else cap,
                "busy": f"{busy:.3f}",
                "used": f"{self._used_since(now - USED_WINDOW, now, busy) or 0.0:.4f}",
                "recent": "" if self.recent is None else f"{self.recent:.4f}",
                "slots": self.slots,
                "updated": f"{now:.3f}",
            },
        )
        pipe.expire(keys.share(self.run_id), int(RUN_SECONDS) + 60)  # the backstop; RUNS decides liveness
        pipe.zadd(keys.RUNS, {self.run_id: now + RUN_SECONDS})
        pipe.zremrangebyscore(keys.RUNS, "-inf", now)
        pipe.zremrangebyscore(keys.NODES, "-inf", now)
        pipe.llen(keys.results(self.run_id))
        pipe.llen(keys.taken(self.run_id))  # taken in by the trainer's ingest thread: no slot either
        *_, waiting, taken = pipe.execute()
        self.results_waiting = waiting + taken
        self.slots = live_slots(self.client, now)
        self.others = {
            run: demand
            for run, s in read_runs(self.client, now).items()
            if run != self.run_id and (demand := _demand(s)) is not None
        }

    def _used_since(self, start: float, now: float, busy: float) -> float | None:
        """The fraction of the farm's slot time this run's tasks ran from `start` (or since it began,
        if later) to `now`; None before a second of record."""
        since, busy_then = next(((t, b) for t, b in self._history if t >= start), self._history[0])
        if now - since < 1.0 or self.slots <= 0:
            return None
        return used_fraction(busy - busy_then, self.slots, now - since)

    def start(self) -> FarmShare:
        try:
            self.refresh()  # the first cap before the first task is sent
        except redis.RedisError:
            pass
        self._thread = threading.Thread(target=self._run, name="rlfarm-share", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            try:
                self.refresh()
            except (redis.RedisError, ValueError):
                continue  # Redis away: the registration lapses, the last cap stands

    def stop(self) -> None:
        """The run is over: its slots go to the others at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.zrem(keys.RUNS, self.run_id)
            pipe.delete(keys.share(self.run_id))
            pipe.execute()
        except redis.RedisError:
            pass  # it expires by itself
        finally:
            self.client.close()

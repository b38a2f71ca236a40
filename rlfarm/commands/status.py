"""`rlfarm status`: what a farm is doing, seen from its Redis.

`gather` reads one `Snapshot` from a Redis client and a Celery app (all the I/O); `render` turns a
snapshot into rich tables and `to_json` into JSON (both pure, so a snapshot can be checked as data).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rlfarm.core import codec
from rlfarm.errors import RunNotFound
from rlfarm.farm import keys
from rlfarm.farm.app import queue_depth
from rlfarm.farm.connection import redact
from rlfarm.farm.policies.store import PolicyStore
from rlfarm.farm.runs import list_runs, read_status
from rlfarm.farm.shares import live_nodes, read_runs
from rlfarm.runio import fit

# Seconds Celery waits for workers to answer a broadcast. It waits that long only for workers it does
# not know of: the broadcast ends as soon as every rlfarm worker in the farm's registry has answered.
INSPECT_TIMEOUT = 1.0
# `rlfarm status --json`'s "schema" (rlfarm/commands/status.schema.json): fields may be added under one
# number; one that goes away or changes its meaning or type bumps it.
SCHEMA = 1
SCHEMA_FILE = Path(__file__).with_name("status.schema.json")


@dataclass(frozen=True)
class Heartbeat:
    """The trainer's `rlfarm:<run>:status` hash, typed. None where a field is absent or unparsable."""

    state: str
    mode: str | None = None
    algo: str | None = None
    env: str | None = None
    env_steps: int | None = None
    total_steps: int | None = None
    version: int | None = None
    sps: float | None = None
    tasks_in_flight: int | None = None
    eval_mean_return: float | None = None  # None until a greedy evaluation has finished
    policy_evals: dict[str, float] | None = None  # several policies: each one's last evaluation
    lines: dict[str, float] | None = None  # several policies: each one's newest version on its own line
    # ASYNC: fraction of the farm's task-slot time, over the last log interval, waiting for the trainer
    slots_waiting: float | None = None
    host: str | None = None
    pid: int | None = None
    started: float | None = None
    updated: float | None = None
    age_s: float | None = None  # seconds since `updated`, at the snapshot's time


@dataclass(frozen=True)
class Share:
    """A run's registration for the farm's fair shares (rlfarm.farm.shares), while its trainer lives."""

    weight: float
    demand: int
    cap: int | None  # None: no limit (alone on the farm, or no rlfarm worker registered)
    used: float  # fraction of the farm's slot time its tasks ran, over the last minute
    slots: int


def parse_share(raw: Mapping[str, str] | None) -> Share | None:
    if not raw:
        return None
    return Share(
        weight=_num(raw, "weight", float) or 1.0,
        demand=_num(raw, "demand", int) or 0,
        cap=_num(raw, "cap", int),
        used=_num(raw, "used", float) or 0.0,
        slots=_num(raw, "slots", int) or 0,
    )


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    algo: str | None = None
    mode: str | None = None
    env: str | None = None
    latest_version: int | None = None
    policy_created: float | None = None
    policy_age_s: float | None = None
    heartbeat: Heartbeat | None = None  # None: expired (no trainer wrote it for keys.STATUS_TTL seconds)
    share: Share | None = None  # None: not training now (or a trainer from before fair shares)


@dataclass(frozen=True)
class WorkerStatus:
    name: str
    processes: int  # pool processes of this worker node
    pids: list[int] = field(default_factory=list)
    tasks_done: int = 0  # tasks this node has received since it started
    protocol: int | None = None  # rlfarm's protocol version it speaks (None: a worker from before versions)
    version: str | None = None  # its rlfarm package version


@dataclass(frozen=True)
class MemoryStatus:
    used_bytes: int
    used_human: str
    max_bytes: int  # 0: no limit
    max_human: str
    policy: str


@dataclass(frozen=True)
class Snapshot:
    redis: str  # the URL, password redacted
    taken: float  # unix time
    queue_depth: int
    memory: MemoryStatus
    workers: list[WorkerStatus]
    runs: list[RunStatus]
    source: str | None = None  # how the farm was found (rlfarm.farm.find): "--redis", "the rlfarm up farm"...

    @property
    def processes(self) -> int:
        return sum(w.processes for w in self.workers)


# ---- parsing (pure) ------------------------------------------------------------------------------
def _num(raw: Mapping[str, str], key: str, kind: type) -> Any:
    try:
        value = kind(float(raw[key])) if kind is int else kind(raw[key])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return None if isinstance(value, float) and math.isnan(value) else value


def _policy_evals(raw: str | None) -> dict[str, float] | None:
    """The heartbeat's policy_evals (JSON {policy: mean return}); None if absent or not that."""
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
        return {str(k): float(v) for k, v in parsed.items()} if isinstance(parsed, dict) else None
    except (ValueError, TypeError, AttributeError):
        return None


def parse_heartbeat(raw: Mapping[str, str], now: float) -> Heartbeat | None:
    if not raw:
        return None
    updated = _num(raw, "updated", float)
    return Heartbeat(
        state=raw.get("state", "?"),
        mode=raw.get("mode"),
        algo=raw.get("algo"),
        env=raw.get("env"),
        env_steps=_num(raw, "env_steps", int),
        total_steps=_num(raw, "total_steps", int),
        version=_num(raw, "version", int),
        sps=_num(raw, "sps", float),
        tasks_in_flight=_num(raw, "tasks_in_flight", int),
        eval_mean_return=_num(raw, "eval_mean_return", float),
        policy_evals=_policy_evals(raw.get("policy_evals")),
        lines=_policy_evals(raw.get("lines")),
        slots_waiting=_num(raw, "slots_waiting", float),
        host=raw.get("host"),
        pid=_num(raw, "pid", int),
        started=_num(raw, "started", float),
        updated=updated,
        age_s=None if updated is None else max(0.0, now - updated),
    )


def parse_workers(stats: Mapping[str, Any] | None) -> list[WorkerStatus]:
    """Celery `inspect().stats()` replies -> one entry per node, sorted by name."""
    workers = []
    for name, s in sorted((stats or {}).items()):
        pool = s.get("pool") or {}
        pids = [int(p) for p in pool.get("processes") or []]
        rlfarm = s.get("rlfarm") or {}
        workers.append(
            WorkerStatus(
                name=name,
                processes=len(pids) or int(pool.get("max-concurrency", 0)),
                pids=pids,
                tasks_done=sum(int(n) for n in (s.get("total") or {}).values()),
                protocol=rlfarm.get("protocol"),
                version=rlfarm.get("version"),
            )
        )
    return workers


def parse_memory(info: Mapping[str, Any]) -> MemoryStatus:
    """Redis `INFO memory` -> the few fields that matter for a farm."""
    return MemoryStatus(
        used_bytes=int(info.get("used_memory", 0)),
        used_human=str(info.get("used_memory_human", "?")),
        max_bytes=int(info.get("maxmemory", 0)),
        max_human=str(info.get("maxmemory_human", "0B")),
        policy=str(info.get("maxmemory_policy", "?")),
    )


# ---- gathering (I/O) -----------------------------------------------------------------------------
def _policy_created(client: Any, run_id: str, version: int) -> float | None:
    """`created` from a version's safetensors header, read with GETRANGE (not the whole blob)."""
    key = keys.policy(run_id, version)
    head = client.getrange(key, 0, 7)
    if len(head) < 8:
        return None  # trimmed between reading `latest` and here, or not a safetensors blob
    n = int.from_bytes(head, "little")
    try:
        meta = codec.policy_metadata(head + client.getrange(key, 8, 8 + n - 1))
        return float(meta["created"])
    except (codec.CodecError, KeyError, ValueError):
        return None


def gather_run(client: Any, run_id: str, now: float, share: Mapping[str, str] | None = None) -> RunStatus:
    store = PolicyStore(client, run_id)
    try:
        config = store.run_meta().get("config", {})
    except (RunNotFound, ValueError):
        config = {}
    latest = store.latest()
    created = None if latest is None else _policy_created(client, run_id, latest)
    heartbeat = parse_heartbeat(read_status(client, run_id), now)
    return RunStatus(
        run_id=run_id,
        algo=config.get("algo") or (heartbeat.algo if heartbeat else None),
        mode=config.get("mode") or (heartbeat.mode if heartbeat else None),
        env=(config.get("env") or {}).get("id") or (heartbeat.env if heartbeat else None),
        latest_version=latest,
        policy_created=created,
        policy_age_s=None if created is None else max(0.0, now - created),
        heartbeat=heartbeat,
        share=parse_share(share),
    )


def most_recent_first(runs: list[RunStatus]) -> list[RunStatus]:
    """Runs with a live trainer first, then by their newest policy: a Redis that has kept many runs
    still shows the ones that matter at the top of a terminal-sized `--watch`."""

    def key(run: RunStatus) -> tuple[int, float, str]:
        live = run.heartbeat is not None and run.heartbeat.state == "running"
        latest = max(filter(None, [run.policy_created, run.heartbeat.updated if run.heartbeat else None]), default=0.0)
        return (0 if live else 1, -latest, run.run_id)

    return sorted(runs, key=key)


def gather(
    client: Any, app: Any, redis_url: str, inspect_timeout: float = INSPECT_TIMEOUT, source: str | None = None
) -> Snapshot:
    """One look at the farm: runs, heartbeats, queue, workers (a Celery broadcast) and Redis memory.
    `source`: how the farm was found, in words (shown first)."""
    # A broadcast waits its whole timeout unless told how many answers to expect: the registered
    # workers' count ends it once they have all answered (a worker not registered, e.g. one that died
    # in the last seconds, only costs the timeout again).
    expected = len(live_nodes(client))
    stats = app.control.inspect(timeout=inspect_timeout, limit=expected or None).stats()
    now = time.time()
    shares = read_runs(client)
    return Snapshot(
        redis=redact(redis_url),
        taken=now,
        queue_depth=queue_depth(client),
        memory=parse_memory(client.info("memory")),
        workers=parse_workers(stats),
        runs=most_recent_first([gather_run(client, run, now, shares.get(run)) for run in list_runs(client)]),
        source=source,
    )


# ---- output (pure) -------------------------------------------------------------------------------
def farm_totals(s: Snapshot) -> dict[str, int]:
    """What an autoscaler sizes the workers by: the farm's slots (pool processes online) and what the
    runs training now ask of them (their tasks queued, running or held back by their shares)."""
    training = [r for r in s.runs if r.share is not None]
    return {
        "slots": s.processes,
        "tasks_queued": s.queue_depth,
        "tasks_wanted": sum(r.share.demand for r in training if r.share is not None),
        "runs_training": len(training),
    }


def to_json(snapshot: Snapshot) -> str:
    data = asdict(snapshot)
    data["schema"] = SCHEMA
    data["processes"] = snapshot.processes
    data["farm"] = {**farm_totals(snapshot), "source": data.pop("source")}
    return json.dumps(data, sort_keys=True)


def _progress(hb: Heartbeat) -> str:
    """`12.2k/100k` and the speed below it: compact, so the column stays narrow (`--json` has the counts)."""
    if hb.env_steps is None:
        return "-"
    steps = fit.count(hb.env_steps) + (f"/{fit.count(hb.total_steps)}" if hb.total_steps else "")
    return steps + ("" if hb.sps is None else f"\n{fit.count(hb.sps)} SPS")


def _memory_line(m: MemoryStatus) -> str:
    if m.max_bytes:
        return f"{m.used_human} of {m.max_human} ({100 * m.used_bytes / m.max_bytes:.1f} %), eviction policy {m.policy}"
    return f"{m.used_human}, no maxmemory limit (policy {m.policy})"


def _worker_version(w: WorkerStatus) -> Any:
    """`0.1.0, protocol 1`; in red when it is not this rlfarm's protocol (it refuses this trainer's tasks)."""
    from rich.text import Text

    from rlfarm.core.protocol import PROTOCOL

    if w.protocol is None:
        return Text("before protocol versions", style="red")
    return Text(f"{w.version or '?'}, protocol {w.protocol}", style="" if w.protocol == PROTOCOL else "red")


STATE_STYLE = {"running": "green", "finished": "cyan", "failed": "red", "stopped": "yellow"}


def _share_cell(share: Share | None) -> str:
    """Weight, the cap it keeps to now, and the slot time its tasks used over the last minute."""
    if share is None:
        return "-"
    cap = "no cap" if share.cap is None else f"cap {share.cap} of {share.slots}"
    return f"weight {share.weight:g}, {cap}\n{100 * share.used:.0f}% of slots (1 min)"


# Columns of the tables, and which go first when the console is too narrow for all of them whole
# (80 columns): what says where a run stands (trainer, steps, eval) stays longest.
WORKER_COLUMNS = ("worker", "rlfarm", "procs", "pids", "received")
WORKER_DROP = ("pids", "received", "rlfarm")
RUN_COLUMNS = ("run", "trainer", "host", "steps", "policy", "in flight", "share", "eval")
RUN_DROP = ("host", "share", "in flight", "policy")


def _table(columns: list[str], rows: list[dict[str, Any]], title: str, **options: Any) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, **options
    )
    for name in columns:
        # Ids (run, worker) are what a user copies: never cut; no column cuts a value, it wraps.
        table.add_column(name, no_wrap=name in ("run", "worker"), overflow="fold")
    for row in rows:
        table.add_row(*(row[name] for name in columns))
    return table


def _run_row(r: RunStatus) -> dict[str, Any]:
    from rich.text import Text

    run = Text(r.run_id)
    run.append(f"\n{(r.algo or '?').upper()} {r.mode or ''} · {r.env or '?'}", style="dim")
    policy = "-" if r.latest_version is None else f"v{r.latest_version}\n{fit.age(r.policy_age_s)} ago"
    hb = r.heartbeat
    if hb is not None and hb.lines:  # several policies: each one's own version line
        policy += "".join(f"\n{name} v{number:.0f}" for name, number in hb.lines.items())
    if hb is None:
        # A trainer's last word (finished, failed, stopped) is kept: a run without any had its trainer
        # killed or its machine lost (or ended before rlfarm kept last words, or was resumed elsewhere).
        run.append("\nno trainer heartbeat (killed?)", style="dim")
        return dict.fromkeys(RUN_COLUMNS, "-") | {"run": run, "policy": policy}
    trainer = Text(hb.state, style=STATE_STYLE.get(hb.state, ""))
    trainer.append(f"\n{fit.age(hb.age_s)} ago", style="dim")
    tasks = "-" if hb.tasks_in_flight is None else str(hb.tasks_in_flight)
    if hb.slots_waiting is not None:  # ASYNC: how much of the farm's slot time waits for the learner
        tasks += f"\n{100 * hb.slots_waiting:.0f}% idle"
    return {
        "run": run,
        "trainer": trainer,
        "host": f"{hb.host or '?'}\npid {hb.pid or '?'}",
        "steps": _progress(hb),
        "policy": policy,
        "in flight": tasks,
        "share": _share_cell(r.share),
        "eval": _eval_cell(hb),
    }


def _eval_cell(hb: Heartbeat) -> str:
    """The last evaluation's mean return; with several policies, a line per policy."""
    if hb.policy_evals:
        return "\n".join(f"{name} {value:.1f}" for name, value in hb.policy_evals.items())
    return "-" if hb.eval_mean_return is None else f"{hb.eval_mean_return:.1f}"


def render(s: Snapshot) -> Any:
    """A rich renderable of the snapshot: a header, the workers and the runs, fitted to the console's
    width (columns left out, least needed first, rather than values cut: rlfarm.runio.fit)."""
    from rich.console import Group
    from rich.text import Text

    taken = datetime.fromtimestamp(s.taken).strftime("%Y-%m-%d %H:%M:%S")
    header = Text.assemble(
        "farm: ",
        (f"{s.source or 'given'}, {s.redis}", "bold"),
        "\n",
        ("rlfarm status", "bold"),
        f"  {taken}\n",
        "broker queue: ",
        (f"{s.queue_depth}", "bold"),
        " task messages waiting\n",
        "Redis memory: ",
        _memory_line(s.memory),
    )

    if s.workers:
        node_rows = [
            {
                "worker": w.name,
                "rlfarm": _worker_version(w),
                "procs": str(w.processes),
                "pids": " ".join(map(str, w.pids)) or "-",
                "received": str(w.tasks_done),
            }
            for w in s.workers
        ]
        node_title = f"{len(s.workers)} worker(s) online, {s.processes} process(es)"
        workers: Any = fit.FitTable(lambda columns: _table(columns, node_rows, node_title), WORKER_COLUMNS, WORKER_DROP)
    else:
        workers = Text(f"no worker answered within {INSPECT_TIMEOUT:g} s", style="yellow")

    if not s.runs:
        return Group(header, workers, Text("no runs in this Redis", style="yellow"))
    run_rows = [_run_row(r) for r in s.runs]
    run_title = f"{len(s.runs)} run(s)"
    runs = fit.FitTable(lambda columns: _table(columns, run_rows, run_title, show_lines=True), RUN_COLUMNS, RUN_DROP)
    return Group(header, workers, runs)

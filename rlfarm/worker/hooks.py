"""What a worker runs beside its two tasks: the worker's Celery glue, in its main process and its pool
processes. rlfarm.worker.app makes the app, calls `install(app)` and defines the tasks, whose body is
`run(request)`.

- Main process: a bootstep adds rlfarm's and the protocol's versions to Celery's `stats` reply; torch
  and rlfarm are imported before the pool forks; a hard time limit is reported to the trainer (the
  killed process cannot); leases of running tasks are renewed from here (rlfarm.worker.main_process); on
  SIGTERM running tasks are handed back at once; with RLFARM_METRICS_ADDR (`rlfarm worker
  --metrics-port`) it serves the worker's Prometheus metrics, from counts its pool processes keep in
  shared memory (rlfarm.worker.counters).
- Pool processes: one torch thread, no CUDA, the hand-back signal, one `TaskHandler` kept for the
  process's life (rlfarm.worker.handler).

Both read the worker's settings (rlfarm.worker.settings) once, when they first need them.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import sys
from collections import deque
from typing import Any

from celery import bootsteps
from celery.exceptions import TimeLimitExceeded
from celery.signals import task_failure, worker_init, worker_process_init, worker_ready, worker_shutting_down
from celery.worker.request import Request

from rlfarm.farm.app import farm_url
from rlfarm.worker.settings import WorkerSettings


class _Process:
    """What this process holds for Celery's signal handlers, which are module functions: one object,
    filled as the worker starts (install, preload) and as its pool processes take their first task."""

    def __init__(self) -> None:
        self.app: Any = None  # the worker's Celery app (rlfarm.worker.app), given to install()
        self.handler: Any = None  # a pool process's TaskHandler, made at its first task
        self.main_client: Any = None  # the worker main process's own Redis client (time-limit reports)
        self.reported: deque[str] = deque(maxlen=1000)  # task ids whose time limit was reported already
        self.hand_back_early = False  # a pool process told to hand back before its first task
        self.counters: Any = None  # rlfarm.worker.counters.NodeCounters: made before the pool forks, shared with it
        self.settings: WorkerSettings | None = None


_process = _Process()


def settings() -> WorkerSettings:
    """This process's settings, read from the environment at the first call (a value that is not a
    number raises there, and again at the next call)."""
    if _process.settings is None:
        _process.settings = WorkerSettings.from_env()
    return _process.settings


class VersionInfo(bootsteps.StartStopStep):
    """Adds this worker's rlfarm and protocol versions to Celery's `stats` reply, which `rlfarm status`
    reads anyway (no second broadcast; a worker from before it simply lacks the key)."""

    def info(self, worker):
        from rlfarm.core.protocol import PROTOCOL, RELEASE

        return {"rlfarm": {"version": RELEASE, "protocol": PROTOCOL}}


class RolloutRequest(Request):
    """Caps a message's hard time limit at the worker's own (`rlfarm worker --time-limit`,
    RLFARM_TASK_TIME_LIMIT): a worker owner bounds what any trainer may ask of its processes. Its
    message's ack and reject survive the broker connection they came on being replaced (`guard_settlement`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cap = settings().task_time_limit
        hard, soft = self.time_limits
        if cap > 0 and not (hard and hard <= cap):
            self.time_limits = (cap, soft)
        guard_settlement(self.message, self.id)


# The one line a settlement on a replaced broker connection logs (tests/test_sentinel.py counts it).
STALE_SETTLEMENT = "broker connection replaced before this task's"


def connection_gone(message: Any) -> bool:
    """Whether the broker connection `message` came on has been torn down: kombu closes a lost
    connection's transport by setting its `client` (the kombu Connection) to None, and a closed
    channel drops its transport. Public attributes of kombu's Message, Channel and Transport;
    `tests/test_sentinel.py::test_a_settlement_knows_when_its_broker_connection_is_gone` fails if they change."""
    channel = getattr(message, "channel", None)
    transport = getattr(channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


def guard_settlement(message: Any, task_id: str) -> None:
    """Make this one message's ack and reject survive the loss of the connection it came on.

    With acks late, a task that runs across a broker reconnect (a Redis Sentinel failover, a
    restart) is acked on the channel it came on, which kombu closed at the reconnect after putting
    its unacked messages back on the queue. kombu's Redis channel then rebuilds a connection pool
    from its transport's connection, which the close set to None; when the close had already
    dropped the channel's pool (a teardown that failed half-way during the failover), the ack
    raised AttributeError("'NoneType' object has no attribute 'hostname'") in the consumer's event
    loop, which Celery takes for an unrecoverable error: the worker stopped consuming and its runs
    waited for it forever. Such an error on a message whose connection is gone is logged as one
    line and dropped: the message is no longer this worker's to settle (kombu restored it, or
    restores it after the visibility timeout), its task may run again, and the trainer keeps the
    first result of a task only. Any other error is raised as before; connection errors are
    Celery's to log (`Message.ack_log_error`)."""
    for name in ("ack", "reject"):
        settle = getattr(message, name)
        setattr(message, name, functools.partial(_settle, message, task_id, name, settle))


def _settle(message: Any, task_id: str, what: str, settle: Any, *args: Any, **kwargs: Any) -> None:
    gone = connection_gone(message)
    try:
        settle(*args, **kwargs)
    except Exception as exc:
        if not gone and not connection_gone(message):
            raise
        errors = getattr(getattr(message, "channel", None), "connection_errors", ())
        if isinstance(exc, tuple(errors)):
            raise
        logging.getLogger("rlfarm.worker").warning(
            "%s %s (task %s): not sent (%s: %s); the broker keeps its message, so the task may run "
            "again, and its trainer takes the first result only",
            STALE_SETTLEMENT,
            what,
            task_id,
            type(exc).__name__,
            exc,
        )
        return
    if gone:
        # kombu rebuilt the closed channel's pool, through the sentinels: the new master has it.
        logging.getLogger("rlfarm.worker").warning(
            "%s %s (task %s): sent on a new connection", STALE_SETTLEMENT, what, task_id
        )


@task_failure.connect
def _report_time_limit(sender=None, task_id=None, exception=None, kwargs=None, **_: object) -> None:
    """A hard time limit kills the pool process mid-task, so the task itself cannot report; the worker's
    main process tells the trainer instead, which re-sends the task or fails with this as the cause."""
    if not isinstance(exception, TimeLimitExceeded) or not kwargs or "run" not in kwargs:
        return
    if task_id in _process.reported:  # Celery signals a hard time limit twice (timeout and pool error paths)
        return
    _process.reported.append(task_id)
    from rlfarm.core import codec, signing
    from rlfarm.farm import keys
    from rlfarm.farm.delivery import deliver

    if _process.main_client is None:
        from rlfarm.farm.outage import OutageRetry, resilient_client

        _process.main_client = resilient_client(farm_url(_process.app), OutageRetry(60.0))
    from rlfarm.core.protocol import Result

    limit = exception.args[0] if exception.args else "?"
    message = Result(
        kwargs.get("kind", "rollout"),
        kwargs.get("iteration"),
        kwargs.get("index"),
        task_id=task_id,
        retryable=True,
        incarnation=kwargs.get("incarnation"),
        worker=f"{socket.gethostname()} (worker main process {os.getpid()})",
        error=f"TimeLimitExceeded: the task ran past its time limit of {limit} s "
        f"({_limit_source(limit)}) in env {kwargs.get('env') or '?'}, and its process was "
        f"killed and replaced (a hung env?)",
    ).to_message()
    run = kwargs["run"]
    # The killed process can no longer renew its lease; drop it so it is not also taken for a lost worker.
    lease = keys.lease(run, keys.task(message["kind"], message["iteration"], message["index"]))
    payload = signing.seal_result(run, codec.pack(message), signing.secret_from_env())
    deliver(_process.main_client, run, payload, delete=(lease,))


def _limit_source(limit: object) -> str:
    """Whose time limit it was: this worker's cap, or the run's."""
    cap = settings().task_time_limit
    try:
        mine = cap > 0 and float(limit) >= cap  # type: ignore[arg-type]
    except (TypeError, ValueError):
        mine = False
    return "this worker's --time-limit" if mine else "the run's farm.task_time_limit, or 10x its longest task when 0"


@worker_init.connect
def _preload(**_: object) -> None:
    # In the worker's main process, before the pool forks: the pool processes inherit numpy, gymnasium
    # and every algorithm's actors already imported instead of each importing them (seconds per
    # process, on shared cores). Not torch: MLP policies act without it (rlfarm.algos.acting), and
    # its import was most of a worker's start (benchmarks/startup.py); a process acting a CNN imports
    # it at its first such task.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # workers never touch CUDA
    import rlfarm.worker.handler  # noqa: F401
    from rlfarm import algos
    from rlfarm.algos.acting import acting_module
    from rlfarm.worker.counters import NodeCounters

    for name in algos.names():  # every algorithm's actors
        acting_module(name)

    _process.counters = NodeCounters()  # mapped now, so every pool process forked later shares it


@worker_process_init.connect
def _init_process(**_: object) -> None:
    # One torch (and BLAS) thread per pool process: W processes on W cores, no oversubscription.
    # Workers never touch CUDA: it cannot be re-initialised in a forked child. torch is here only where
    # the worker was forked from a trainer (rlfarm.local.forked); a process that imports it later sets
    # its threads then (rlfarm.worker.policies).
    from threadpoolctl import threadpool_limits

    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    # numpy's BLAS too (the MLP actors' matrix products): its threads spin waiting for each other
    # on cores the other processes hold (benchmarks/actor_threads.py: a 256x256 actor several times slower).
    threadpool_limits(limits=1)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import signal

    from rlfarm.worker.main_process import HAND_BACK_SIGNAL

    signal.signal(HAND_BACK_SIGNAL, _hand_back_signalled)


def _hand_back_signalled(signum: int, frame: object) -> None:
    """In a pool process: its worker is shutting down (rlfarm.worker.main_process): hand the running task back."""
    if _process.handler is None:
        _process.hand_back_early = True
    else:
        _process.handler.on_hand_back()  # raises HandedBack inside the running task, if there is one


@worker_ready.connect
def _keep_leases(sender=None, **_: object) -> None:
    """In the worker's main process, once its pool runs: renew running tasks' leases from here too,
    where an env hung in GIL-holding C code cannot stop it (rlfarm.worker.main_process.LeaseKeeper)."""
    from rlfarm.worker.main_process import LeaseKeeper

    # Its pool processes are the farm's slots, which runs training at once divide (rlfarm.farm.shares).
    controller = getattr(sender, "controller", None)
    _controller[:] = [controller]
    slots = int(getattr(controller, "concurrency", 0) or _process.app.conf.worker_concurrency or os.cpu_count() or 1)
    node = str(getattr(sender, "hostname", sender))
    LeaseKeeper(farm_url(_process.app), _running_tasks, node=node, slots=slots).start()
    _term_once()
    listen = settings().metrics_addr
    if listen:
        _serve_metrics(node, slots, listen)


def _serve_metrics(node: str, slots: int, listen: str) -> None:
    """This worker's Prometheus metrics (`rlfarm worker --metrics-port`), from its main process: slots
    from its pool, busy ones from Celery's running requests, the rest from its pool processes' counts."""

    from rlfarm.core.protocol import PROTOCOL, RELEASE
    from rlfarm.runio import exporter

    def values() -> dict:
        totals = _process.counters.totals() if _process.counters is not None else {}
        return {"slots": slots, "slots_busy": len(_running_tasks()), **totals}

    labels = {"worker": node, "version": RELEASE, "protocol": str(PROTOCOL)}
    try:
        host, port = exporter.parse_listen(listen)
        served = exporter.serve(
            exporter.LiveCollector("worker", exporter.WORKER_METRICS, "worker", lambda: labels, values), host, port
        )
    except exporter.MetricsError as exc:  # `rlfarm worker` checked it; a plain celery worker may not have
        logging.getLogger("rlfarm.worker").error("no metrics: %s", exc)
        return
    logging.getLogger("rlfarm.worker").info("Prometheus metrics of %s at %s", node, served.url)


def _term_once() -> None:
    """Celery's SIGTERM handler, called for the first SIGTERM only. It takes a lock of Celery's signal
    dispatch (worker_shutting_down) without blocking signals; a second SIGTERM arriving inside it ran
    it again, which waited for that lock forever: a worker of a SIGKILLed trainer (its death signal is
    SIGTERM, rlfarm.local.cluster) was found so 50 minutes later, its pool idle. The
    first SIGTERM already shuts the worker down (hand-back, then exit within --shutdown-grace)."""
    celery_handler = signal.getsignal(signal.SIGTERM)
    if not callable(celery_handler) or getattr(celery_handler, "rlfarm_once", False):
        return
    fired = []

    def once(signum: int, frame: object) -> None:
        if fired:
            return  # a shutdown is under way
        fired.append(signum)
        celery_handler(signum, frame)

    once.rlfarm_once = True  # type: ignore[attr-defined]
    try:
        signal.signal(signal.SIGTERM, once)
    except ValueError:  # not the main thread: Celery's handler stays as it is
        pass


_stop_asked: list[str] = []  # how a signal asked the worker to stop (none: it stopped by itself)
_controller: list[Any] = []  # Celery's WorkController, once the worker is ready


def stopped_by_itself() -> bool:
    """Whether the worker, once ready, stopped with an error code (Celery's "Unrecoverable error")
    and no signal (SIGTERM, SIGINT, SIGQUIT) had asked it to: rlfarm.cli.worker starts it again."""
    code = getattr(_controller[0], "exitcode", None) if _controller else None
    # EX_FAILURE (1) exactly: a remote `shutdown` (rlfarm down) stops it with a message as its code
    return code == 1 and not _stop_asked


@worker_shutting_down.connect
def _hand_back_running_tasks(sender=None, how=None, **_: object) -> None:
    """SIGTERM (or SIGINT) to the worker's main process: Celery's warm shutdown would wait for the
    running tasks, minutes for an Atari or MuJoCo task, past a spot instance's notice. Hand them back
    at once instead (the trainer re-sends them immediately) and exit within the shutdown grace
    (RLFARM_SHUTDOWN_GRACE s). Runs in a signal handler: the work is done on a thread."""
    _stop_asked.append(str(how))
    if how != "Warm":
        return
    import threading

    threading.Thread(target=_hand_back, args=(str(sender),), name="rlfarm-hand-back", daemon=True).start()


def _running_tasks(only: set[str] | None = None) -> list:
    from celery.worker import state

    from rlfarm.worker.main_process import task_of

    for _ in range(10):  # the main thread may change the set while another thread copies it
        try:
            requests = list(state.active_requests)
            break
        except RuntimeError:
            continue
    else:
        return []
    tasks = []
    for request in requests:
        task = task_of(request.id, request.kwargs, request.worker_pid)
        if task is not None and (only is None or task.task_id in only):
            tasks.append(task)
    return tasks


def _hand_back(node: str) -> None:
    import time

    from rlfarm.worker import main_process as N

    tasks = _running_tasks()
    if not tasks:
        return
    grace = settings().shutdown_grace
    logging.getLogger("rlfarm.worker").warning(
        "shutting down: handing back %d running task(s) to their trainers", len(tasks)
    )
    N.ask_to_hand_back(tasks)
    deadline = time.monotonic() + grace
    ids = {t.task_id for t in tasks}
    while time.monotonic() < deadline:
        if not _running_tasks(ids):
            return
        time.sleep(0.1)  # polling the pool's bookkeeping, at most `grace` seconds
    N.force_hand_back(N.client_for(farm_url(_process.app)), _running_tasks(ids), node, grace)


def _rollout_worker():
    if _process.handler is None:
        from rlfarm.worker.handler import TaskHandler

        _process.handler = TaskHandler(
            farm_url(_process.app),
            settings(),
            counters=_process.counters,
            stop_worker=_stop_worker,
            hand_back=_process.hand_back_early,
        )
    return _process.handler


def _stop_worker() -> None:
    """From a pool process: SIGTERM to the worker's main process, its ordinary way to stop (running
    tasks handed back at once, rlfarm.worker.main_process)."""
    import signal

    os.kill(os.getppid(), signal.SIGTERM)


class TaskFailed(Exception):
    """A task the worker refused (a bad signature, no secret, another protocol, a bad spec) or that
    failed, raised once the trainer has its answer in Redis: Celery then records the task as FAILURE
    (Flower, `task-failed` events), not SUCCESS. Its one argument is that answer's error line, a
    string, so any result serializer (msgpack, json) carries it. The tasks declare it expected
    (`throws`): the worker logs it in one line, without a traceback."""


def run(request) -> None:
    # Exactly the kwargs the trainer sent (signed with RLFARM_SECRET when it is set), not the
    # signature's defaults: the worker verifies the signature over them before anything runs.
    error = _rollout_worker().handle(dict(request.kwargs), request.id, node=request.hostname)
    if error is not None:
        raise TaskFailed(error)


def install(app: Any) -> None:
    """Wire this module into `app` (the signal handlers above are connected on import)."""
    _process.app = app
    app.steps["worker"].add(VersionInfo)

"""Counters the farm benchmarks (task_cost.py, scale.py, ceiling.py) read around a measured phase:
Redis's own CPU, network bytes and commands (INFO), round trips this process made to Redis, CPU and
memory of worker process trees, and a farm of `rlfarm worker` nodes with a run in its Redis.

Nothing here is imported by rlfarm; the scripts import it as `farmstats` (their directory is on
sys.path when they run as `python benchmarks/NAME.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis

import rlfarm

# The rlfarm checkout being measured: the one on PYTHONPATH (a `--before` comparison runs this same
# script against an older checkout), whose cli.py the worker nodes run.
CODE_ROOT = Path(rlfarm.__file__).resolve().parents[1]
BENCH_ROOT = Path(__file__).resolve().parents[1]  # for benchmarks.slow_envs, here and on the workers
if str(BENCH_ROOT) not in sys.path:
    sys.path.append(str(BENCH_ROOT))


# ---- Redis: INFO counters and this process's round trips ---------------------------------------
@dataclass
class RedisSample:
    cpu: float  # used_cpu_sys + used_cpu_user, seconds
    net_in: int  # total_net_input_bytes
    net_out: int
    calls: dict[str, int]  # commandstats: calls per command
    usec: dict[str, int]  # commandstats: microseconds inside each command

    def minus(self, before: RedisSample) -> RedisSample:
        return RedisSample(
            self.cpu - before.cpu,
            self.net_in - before.net_in,
            self.net_out - before.net_out,
            _add(self.calls, before.calls, -1),
            _add(self.usec, before.usec, -1),
        )

    def plus(self, other: RedisSample) -> RedisSample:
        return RedisSample(
            self.cpu + other.cpu,
            self.net_in + other.net_in,
            self.net_out + other.net_out,
            _add(self.calls, other.calls),
            _add(self.usec, other.usec),
        )


def _add(a: dict[str, int], b: dict[str, int], sign: int = 1) -> dict[str, int]:
    keys = a.keys() | b.keys()
    return {k: a.get(k, 0) + sign * b.get(k, 0) for k in sorted(keys) if a.get(k, 0) + sign * b.get(k, 0)}


def redis_sample(client: redis.Redis) -> RedisSample:
    info = client.info("all")
    calls, usec = {}, {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and key != "cmdstat_info":  # our own INFO calls are not the farm's
            calls[key[8:]] = int(value["calls"])
            usec[key[8:]] = int(value["usec"])
    return RedisSample(
        float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        int(info["total_net_input_bytes"]),
        int(info["total_net_output_bytes"]),
        calls,
        usec,
    )


class RoundTrips:
    """Requests this process sends to Redis: a command is one, a pipeline (transaction or not) is one,
    whichever client sends it (rlfarm's, kombu's). Counted by wrapping redis-py's send_packed_command,
    through which every request goes."""

    count = 0
    _installed = False

    @classmethod
    def install(cls) -> None:
        if cls._installed:
            return
        from redis.connection import AbstractConnection

        original = AbstractConnection.send_packed_command

        def counted(self: Any, command: Any, check_health: bool = True) -> Any:
            cls.count += 1
            return original(self, command, check_health)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
        cls._installed = True


@dataclass
class Meter:
    """What measured phases cost, summed over their runs: wall and CPU seconds of this process, its
    round trips to Redis, and Redis's own counters."""

    wall: float = 0.0
    cpu: float = 0.0
    trips: int = 0
    redis: RedisSample = dataclasses.field(default_factory=lambda: RedisSample(0.0, 0, 0, {}, {}))

    @contextlib.contextmanager
    def measure(self, client: redis.Redis) -> Iterator[None]:
        """Adds what the `with` block costs (the INFO calls around it are outside)."""
        before = redis_sample(client)
        trips0, cpu0, t0 = RoundTrips.count, time.process_time(), time.perf_counter()
        yield
        self.wall += time.perf_counter() - t0
        self.cpu += time.process_time() - cpu0
        self.trips += RoundTrips.count - trips0
        self.redis = self.redis.plus(redis_sample(client).minus(before))


# ---- processes: CPU and memory of a worker node (main process and its pool) ---------------------
def tree(pid: int) -> list[psutil.Process]:
    try:
        main = psutil.Process(pid)
        return [main, *main.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def node_cpu(pids: list[int]) -> tuple[float, float]:
    """CPU seconds so far of the nodes' main processes (Celery's consumer: delivery, acks) and of their
    pool processes (the tasks)."""
    main = pool = 0.0
    for pid in pids:
        procs = tree(pid)
        main += cpu_seconds(procs[:1])
        pool += cpu_seconds(procs[1:])
    return main, pool


def pss_mib(pids: list[int]) -> tuple[float, int]:
    """Proportional set size of the nodes' process trees (shared pages split between the processes
    that share them, so it adds up), MiB, and how many processes."""
    total, n = 0, 0
    for pid in pids:
        for p in tree(pid):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_full_info().pss
                n += 1
    return total / 2**20, n


def loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# ---- a farm: redis-server, a run, worker nodes -------------------------------------------------
def worker_env() -> dict[str, str]:
    """What worker nodes need: this checkout and the benchmarks importable, their envs allowed."""
    path = os.pathsep.join(dict.fromkeys([str(CODE_ROOT), str(BENCH_ROOT)]))
    return {"PYTHONPATH": path, "RLFARM_ALLOWED_ENV_MODULES": "benchmarks.slow_envs"}


def node_command() -> list[str]:
    """`rlfarm worker` of the checkout being measured (LocalCluster adds -c N -n NODE)."""
    return [sys.executable, str(CODE_ROOT / "cli.py"), "worker", "-l", "WARNING"]


def make_run(client: redis.Redis, run: str, env_id: str, num_envs: int, compress: str = "auto") -> Any:
    """Run metadata and policy version 0 in Redis, as a trainer writes them; returns the network."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import describe
    from rlfarm.farm.policies.store import PolicyStore

    torch.set_num_threads(1)
    cfg = C.build(None, [f"run_id={run}", f"env.id={env_id}", f"env.num_envs={num_envs}", f"farm.compress={compress}"])
    space = describe(env_id, C.to_dict(cfg)["env"])
    store = PolicyStore(client, run)
    store.set_run_meta({"config": C.to_dict(cfg), "space": space.to_dict()})
    torch.manual_seed(0)
    network = ActorCritic(space, cfg.policy)
    store.publish(0, network.state_dict(), "ppo")
    return network


def task_channel(app: Any, client: redis.Redis, run: str, task_timeout: float, max_redispatch: int) -> Any:
    """The trainer's task channel of the checkout being measured, no trainer behind it (a Dispatcher
    in a checkout from before the dispatcher was split into a channel and a watchdog)."""
    try:
        from rlfarm.trainer.channel import FarmLink
    except ImportError:
        from rlfarm.farm.dispatch import Dispatcher

        return Dispatcher(app, client, run, task_timeout, max_redispatch)
    return FarmLink(app, client, run, task_timeout, max_redispatch).open()


class Farm:
    """The redis-server, the run, the worker nodes and one trainer-side task channel."""

    def __init__(self, cluster: Any, run: str, env_id: str, per_node: int):
        from rlfarm.farm.app import make_app
        from rlfarm.farm.connection import connect
        from rlfarm.farm.policies.store import PolicyStore

        self.cluster = cluster
        self.per_node = per_node
        self.client = connect(cluster.redis_url)
        self.network = make_run(self.client, run, env_id, 1)
        self.store = PolicyStore(self.client, run, keep=3)
        self.version = 0
        self.d = task_channel(make_app(cluster.redis_url), self.client, run, 600, 1)
        self.nodes: list[int] = []  # pool processes per node
        self.task = 0  # task numbers (iteration field), never reused

    @property
    def size(self) -> int:
        return sum(self.nodes)

    def grow(self, workers: int) -> None:
        """Add nodes (started together, then waited for) until there are `workers` pool processes."""
        added = []
        while self.size < workers:
            n = min(self.per_node, workers - self.size)
            added.append(self.cluster.add_worker(n, command=node_command(), wait=False))
            self.nodes.append(n)
        for proc in added:
            i = self.cluster.worker_procs.index(proc)
            self.cluster.wait_for_worker(proc, self.cluster._nodes[i], timeout=300)

    def publish(self) -> int:
        self.version += 1
        self.store.publish(self.version, self.network.state_dict(), "ppo")
        return self.version

    def submit(self, steps: int, version: int | str, sent: dict[int, float]) -> None:
        """Send task number `self.task`; when submit() was called goes into `sent` under its number."""
        sent[self.task] = time.time()
        self.d.submit({"iteration": self.task, "index": 0, "version": version, "steps": steps, "seed": 1})
        self.task += 1

    def submit_group(self, steps: int, version: int | str, count: int, sent: dict[int, float]) -> None:
        """A SYNC group, sent as TaskChannel.gather_group sends it (submit_many where this checkout
        has it, else one submit after another); each task's `sent` is when the group's sending began."""
        now = time.time()
        specs = [
            {"iteration": self.task + i, "index": 0, "version": version, "steps": steps, "seed": 1}
            for i in range(count)
        ]
        for i in range(count):
            sent[self.task + i] = now
        if hasattr(self.d, "submit_many"):
            self.d.submit_many(specs)
        else:
            for spec in specs:
                self.d.submit(spec)
        self.task += count

    def next(self) -> Any:
        message = None
        while message is None:
            message = self.d.next_result(timeout=1.0)
        return message

    def cpu(self) -> dict[str, float]:
        main, pool = node_cpu([p.pid for p in self.cluster.worker_procs])
        return {"trainer": time.process_time(), "redis": redis_sample(self.client).cpu, "celery": main, "pool": pool}


@dataclass
class Timeline:
    """Per task, from the trainer's clock and the worker's (one machine: the same clock)."""

    submitted: float  # epoch, when submit() was called
    received: float  # epoch, when next_result() returned it
    result: Any

    @property
    def started(self) -> float:
        """When the worker took the task (entered handle), from the result's own timings."""
        r = self.result
        return r.finished - r.duration - r.timings["checks"]

    @property
    def delivery(self) -> float:
        """submit() called -> the worker's handle began: the trainer's submit (SADD, the Celery message,
        LPUSH), then the broker, Celery's consumer and the pool process."""
        return self.started - self.submitted

    @property
    def back(self) -> float:
        """Rollout done -> the trainer has it: encode, push, BLPOP wake-up (and any wait for the trainer)."""
        return self.received - self.result.finished


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def header(title: str) -> str:
    return f"{title}\ncores: {os.cpu_count()}  load average (1/5/15 min): {loadavg()}  rlfarm: {CODE_ROOT}"


def dump(path: str | None, data: Any) -> None:
    """Raw figures as JSON, for a comparison run to read back."""
    if path:
        Path(path).write_text(json.dumps(data, indent=1, default=float))


def run_before(root: str, script: str, argv: list[str]) -> None:
    """`script` (a benchmark) with `argv` minus its --before, against the checkout at `root` (put on
    PYTHONPATH): its output comes first, then this run's own."""
    import subprocess

    args = [a for i, a in enumerate(argv) if a != "--before" and (i == 0 or argv[i - 1] != "--before")]
    print(f"\n==== before: {root} ====", flush=True)
    subprocess.run([sys.executable, script, *args], env={**os.environ, "PYTHONPATH": root}, check=True)
    print(f"\n==== after: {CODE_ROOT} ====", flush=True)

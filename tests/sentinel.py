"""A Redis Sentinel group on 127.0.0.1 for tests: a master, a replica and three sentinels, real
`redis-server` and `redis-sentinel` processes started and stopped by pid, with workers on it.

The sentinels judge a master down after 1 s without an answer (`down-after-milliseconds`), so a
failover takes seconds, as it would with a production setting of a few seconds.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from rlfarm.local.cluster import (
    LOOPBACK,
    LocalCluster,
    die_with_parent,
    find_redis_server,
    free_port,
    stop_process_group,
)

MASTER_NAME = "rlfarm"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


def sentinel_command() -> list[str]:
    """Debian's redis-sentinel (conftest.SYSTEM_PACKAGES stops the tests early without it)."""
    return [shutil.which("redis-sentinel") or "redis-sentinel"]


class SentinelGroup:
    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent
        )

    def _server(self, name: str, *args: str, port: int | None = None) -> None:
        port = self.ports[name] = port or free_port()
        data = self.root / name
        data.mkdir(exist_ok=True)
        self._spawn(
            name,
            [
                find_redis_server(),
                "--port",
                str(port),
                "--bind",
                LOOPBACK,
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
                str(data),
                "--daemonize",
                "no",
                "--loglevel",
                "notice",
                "--client-output-buffer-limit",
                "pubsub",
                "0",
                "0",
                "0",
                # large results must not cut the replica off (it would resync in a loop)
                "--client-output-buffer-limit",
                "replica",
                "0",
                "0",
                "0",
                *args,
            ],
        )

    def start(self) -> None:
        self._server("master")
        self._server("replica", "--replicaof", LOOPBACK, str(self.ports["master"]))
        replica = redis.Redis(host=LOOPBACK, port=self.ports["replica"], socket_connect_timeout=1)
        self._wait(
            lambda: replica.info("replication").get("master_link_status") == "up", "the replica linked to its master"
        )
        for i in range(3):
            name = f"sentinel-{i}"
            port = self.ports[name] = free_port()
            conf = self.root / f"{name}.conf"  # a sentinel rewrites its file with what it learns
            conf.write_text(
                f"port {port}\nbind {LOOPBACK}\ndaemonize no\ndir {self.root}\n"
                f"sentinel monitor {MASTER_NAME} {LOOPBACK} {self.ports['master']} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n"
            )
            self._spawn(name, [*sentinel_command(), str(conf)])
        for i in range(3):  # each knows the replica and the two other sentinels: a failover can happen
            self._wait(lambda i=i: self._ready(i), f"sentinel {i} ready (replica and quorum known)")

    def _ready(self, i: int) -> bool:
        client = self.sentinel_client(i)
        try:
            replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
            client.execute_command("SENTINEL", "CKQUORUM", MASTER_NAME)
            sentinels = client.execute_command("SENTINEL", "SENTINELS", MASTER_NAME)
        except redis.RedisError:
            return False
        finally:
            client.close()
        return len(replicas) == 1 and len(sentinels) == 2

    def _wait(self, condition, what: str) -> None:
        from .conftest import poll

        def alive_and(cond):
            dead = [n for n, p in self.procs.items() if p.poll() is not None and n != "master"]
            if dead:
                pytest.fail(f"{what}: {dead} exited; see {self.root}")
            try:
                return cond()
            except redis.RedisError:
                return False

        poll(lambda: alive_and(condition), what)

    def sentinel_client(self, i: int = 0) -> redis.Redis:
        return redis.Redis(
            host=LOOPBACK,
            port=self.ports[f"sentinel-{i}"],
            socket_connect_timeout=1,
            socket_timeout=2,
            decode_responses=True,
        )

    @property
    def url(self) -> str:
        hosts = ";".join(f"sentinel://{LOOPBACK}:{self.ports[f'sentinel-{i}']}" for i in range(3))
        return f"{hosts}/0?master_name={MASTER_NAME}"

    def master_port(self) -> int | None:
        """The master's port as the sentinels see it now."""
        for i in range(3):
            client = self.sentinel_client(i)
            try:
                host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
                return int(port)
            except (redis.RedisError, TypeError, ValueError):
                continue
            finally:
                client.close()
        return None

    def kill_master(self) -> int:
        """SIGKILL the redis-server that is master now (a lost machine); returns its port."""
        port = self.master_port()
        name = next(n for n, p in self.ports.items() if p == port)
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()
        return port

    def revive(self, port: int) -> None:
        """Start the redis-server killed at `port` again, on that port, as a replica of the master the
        sentinels name now (a lost machine back), and wait until the group is whole again: every
        sentinel names one master, the other server copies it, and every sentinel knows that one as
        a replica it may promote, so the group can fail over once more. On a loaded machine the
        sentinels may fail over again meanwhile (a new master slow to answer): the revived server is
        then the master, and the group is whole all the same."""
        name = next(n for n, p in self.ports.items() if p == port)
        self._server(name, "--replicaof", LOOPBACK, str(self.master_port()), port=port)
        self._wait(self._whole, f"the revived redis-server on {port} back in the group, known to every sentinel")

    def _whole(self) -> bool:
        masters = {self._master_of(i) for i in range(3)}
        if len(masters) != 1 or None in masters:
            return False
        [master] = masters
        [other] = [p for n, p in self.ports.items() if n in ("master", "replica") and p != master]
        client = redis.Redis(host=LOOPBACK, port=other, socket_connect_timeout=1, socket_timeout=2)
        try:
            info = client.info("replication")
        finally:
            client.close()
        copying = info.get("master_link_status") == "up" and int(info.get("master_port", 0)) == master
        return copying and all(self._knows_replica(i, other) for i in range(3))

    def _master_of(self, i: int) -> int | None:
        client = self.sentinel_client(i)
        try:
            return int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)[1])
        finally:
            client.close()

    def _knows_replica(self, i: int, port: int) -> bool:
        """Sentinel `i` lists the replica at `port` as up (no s_down flag): it may promote it."""
        client = self.sentinel_client(i)
        try:
            replicas = client.execute_command("SENTINEL", "REPLICAS", MASTER_NAME)
        finally:
            client.close()
        for replica in replicas:
            info = dict(zip(replica[::2], replica[1::2])) if isinstance(replica, list) else replica
            if int(info.get("port", 0)) == port and "s_down" not in info.get("flags", ""):
                return True
        return False

    def stop(self) -> None:
        for proc in self.procs.values():
            stop_process_group(proc, grace=5.0)


class SentinelFarm(LocalCluster):
    """LocalCluster's workers on a Sentinel group instead of one redis-server: `redis_url` is the
    Sentinel URL, which the workers, the trainer and Celery all take."""

    def __init__(self, root: Path, **kwargs):
        self.group = SentinelGroup(root / "sentinel")
        super().__init__(workers=0, log_dir=root, **kwargs)

    @property
    def redis_url(self) -> str:
        return self.group.url

    def start_redis(self, timeout: float = 20.0, same_port: bool = False) -> None:
        self.group.start()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.group.stop()

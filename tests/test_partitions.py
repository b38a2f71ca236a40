"""Network partitions, done for real: a worker or the trainer cut off from Redis mid-run by its
network namespace's link going down or by its packets being dropped, then joined again.

Each test makes three network namespaces of its own (names with this process's pid, removed at the
end whatever happens): Redis's, with a bridge at 10.213.0.1, and two sides joined to that bridge by
veth pairs, "cut" (10.213.0.2) and "kept" (10.213.0.3). Nothing here has an address outside them,
and no traffic reaches the host's own interfaces. This test process enters Redis's namespace (its
own thread only) to read Redis and ping workers; every process it starts runs under `ip netns exec`.

The run is cheap and deterministic (SYNC PPO, fresh episodes): it must finish with the fault-free
run's policy, nothing counted twice, and the outage named "unreachable", never "stalled". Below, the
classification itself as a unit test.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from rlfarm.farm import keys
from rlfarm.farm.outage import OutageRetry, can_connect, outage_kind

from .conftest import ROOT, WORKER_ENV, assert_nothing_lost_or_double_counted, poll, read_summary, rlfarm_cmd

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("partitions")


# ---- the unreachable/stalled decision (unit) -------------------------------------------------------
def test_a_timeout_is_a_stall_only_while_redis_accepts_connections():
    timeout, lost = redis.TimeoutError("Timeout reading from socket"), redis.ConnectionError("refused")
    assert outage_kind(timeout, reachable=True) == "stalled"  # DEBUG SLEEP, a fork, a paused server
    assert outage_kind(timeout, reachable=False) == "unreachable"  # packets dropped, a link down
    assert outage_kind(timeout, reachable=None) == "stalled"  # no probe could be made: as before
    assert outage_kind(TimeoutError(), reachable=False) == "unreachable"
    assert outage_kind(lost, reachable=True) == outage_kind(lost, reachable=None) == "unreachable"
    # A connect that timed out was a partition even if the link is back by the probe (a worker's
    # second notice, printed as the partition healed, once called it a stall).
    assert outage_kind(redis.TimeoutError("Timeout connecting to server"), reachable=True) == "unreachable"


@pytest.mark.parametrize(
    "error, reachable, said, not_said",
    [
        (redis.TimeoutError("Timeout reading from socket"), True, "it is stalled", "unreachable"),
        (redis.TimeoutError("Timeout reading from socket"), False, "it is unreachable", "stalled"),
        (redis.ConnectionError("Error 101 connecting: Network is unreachable"), True, "it is unreachable", "stalled"),
    ],
)
def test_the_outage_message_says_what_the_probe_found(error, reachable, said, not_said):
    """OutageRetry probes only after a timeout; its first notice and the one at the limit follow."""
    notices: list[str] = []
    probes: list[bool] = []
    retry = OutageRetry(limit=0.0, where="Redis at redis://10.213.0.1:6379/0", notify=notices.append)
    retry.probe = lambda: probes.append(reachable) or reachable

    def fails():
        raise error

    with pytest.raises(Exception) as raised:
        retry.run(fails)
    assert len(probes) == (1 if isinstance(error, redis.TimeoutError) else 0)
    assert said in notices[0] and not_said not in notices[0], notices
    kind = "did not answer" if "stalled" in said else "unreachable"
    assert f"Redis at redis://10.213.0.1:6379/0 {kind} for more than 0 s" in str(raised.value)


def test_an_attempt_sent_during_the_outage_that_just_ended_starts_no_new_one():
    """A send whose connect began in the partition (its SYN dropped, the next retransmit past the
    connect timeout) fails after another thread has seen Redis back: that is the old outage's
    attempt, retried without a notice; an attempt sent after the recovery that fails is a new one."""
    notices: list[str] = []
    retry = OutageRetry(limit=60.0, where="Redis", notify=notices.append, max_backoff=0.0)
    retry.probe = lambda: True  # the link is back by the time the stale attempt fails
    sent_in_partition = time.monotonic()
    retry._failed(redis.TimeoutError("Timeout reading from socket"), 1, sent_in_partition)
    retry._recovered()
    assert [n.split(" ", 3)[:3] for n in notices] == [["Redis", "did", "not"], ["Redis", "answered", "again"]]
    notices.clear()
    retry._failed(TimeoutError("timed out"), 1, sent_in_partition)  # the stale connect's timeout
    assert notices == [] and retry.outage_started is None and retry.outages == 1
    retry._failed(TimeoutError("timed out"), 1, time.monotonic())  # sent after the recovery
    assert len(notices) == 1 and "it is stalled" in notices[0], notices


def test_the_probe_is_a_fresh_connect(tmp_path):
    """can_connect: accepted by a listening socket (a stalled Redis's kernel still accepts), refused
    where nothing listens. A Unix socket: no network in a unit test."""
    path = str(tmp_path / "redis.sock")
    assert not can_connect(path, timeout=1.0)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(1)  # never accepts: as a Redis frozen in DEBUG SLEEP
        assert can_connect(path, timeout=1.0)


# ---- network namespaces ---------------------------------------------------------------------------
def _netns_missing() -> str | None:
    if os.geteuid() != 0:
        return "network partitions need root (ip netns, iptables); CI runs them as root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"network partitions need {tool} (iproute2, iptables)"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is not available here"
    return None


needs_netns = pytest.mark.skipif(_netns_missing() is not None, reason=_netns_missing() or "")

REDIS_ADDRESS = "10.213.0.1"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


@contextlib.contextmanager
def inside(namespace: str):
    """This thread in `namespace` (setns applies to the calling thread only), back where it was after."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


class Partition:
    """Redis's namespace with a bridge, and the "cut" and "kept" sides each on a veth pair to it.
    `cut(how)` cuts the "cut" side off ("link": its end of the veth down; "drop": every packet in and
    out dropped by iptables in its namespace); `heal()` joins it again."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.redis, self.cut_ns, self.kept_ns = f"rf-redis-{pid}", f"rf-cut-{pid}", f"rf-kept-{pid}"
        self.made: list[str] = []
        self.how: str | None = None

    def exec(self, namespace: str) -> list[str]:
        """The prefix that runs a command in `namespace` (`ip netns exec` execs: the pid is the command's)."""
        return ["ip", "netns", "exec", namespace]

    def make(self) -> None:
        for ns in (self.redis, self.cut_ns, self.kept_ns):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.redis, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.redis, "addr", "add", f"{REDIS_ADDRESS}/24", "dev", "br0")
        sh("ip", "-n", self.redis, "link", "set", "br0", "up")
        for n, ns in ((2, self.cut_ns), (3, self.kept_ns)):
            # Made inside Redis's namespace, its peer born in the side's: nothing touches the host's.
            sh("ip", "-n", self.redis, "link", "add", f"v{n}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.redis, "link", "set", f"v{n}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"10.213.0.{n}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def _rules(self, action: str) -> None:
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
            sh(*self.exec(self.cut_ns), "iptables", "-w", action, chain, flag, "eth0", "-j", "DROP")

    def cut(self, how: str) -> None:
        if how == "link":
            sh("ip", "-n", self.cut_ns, "link", "set", "eth0", "down")
        else:
            self._rules("-A")
        self.how = how

    def heal(self) -> None:
        if self.how == "link":
            sh("ip", "-n", self.cut_ns, "link", "set", "eth0", "up")
        elif self.how == "drop":
            self._rules("-D")
        self.how = None

    def remove(self) -> None:
        for ns in reversed(self.made):  # its veth pairs go with it
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []


# ---- the run -------------------------------------------------------------------------------------
RLFARM_WORKER = [sys.executable, str(ROOT / "cli.py"), "worker", "-l", "INFO"]  # INFO: its skip notes
STEPS_PER_TASK = 1000  # 2 s of tiny_envs:slow: a cut catches a task running
TOTAL_STEPS = 8000  # 4 iterations of 2 tasks
RUN = [
    "--preset",
    "cartpole-ppo",
    "--env",
    "tests.tiny_envs:slow",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=2",
    "--set",
    f"farm.steps_per_env={STEPS_PER_TASK}",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "eval.interval=0",
    "--total-steps",
    str(TOTAL_STEPS),
]
WORKER_OUTAGE_SECONDS = 15.0  # a worker's fault: past its lease (10 s), so its running task is sent again


class Farm:
    """Redis in its namespace, one `rlfarm worker` (one pool process) on each side named, and the
    trainer on its side; this thread sits in Redis's namespace while it lives (`inside`)."""

    def __init__(self, part: Partition, tmp_path: Path, run_id: str):
        from rlfarm.local.cluster import LocalCluster, RedisSpec

        self.part, self.tmp_path, self.run_id = part, tmp_path, run_id
        self.cluster = LocalCluster(
            workers=0,
            name=f"rlfarm-part-{os.getpid()}",
            log_dir=tmp_path,
            extra_env={**WORKER_ENV, "RLFARM_REDIS_OUTAGE_TIMEOUT": "120"},
            # reachable only inside this test's namespaces
            redis=RedisSpec(args=("--protected-mode", "no"), host=REDIS_ADDRESS, prefix=tuple(part.exec(part.redis))),
        )
        self.trainer: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}

    def start(self, trainer_side: str, worker_sides: tuple[str, ...]) -> None:
        self.cluster.start()
        self.client = redis.Redis.from_url(self.cluster.redis_url, socket_timeout=5)
        for i, side in enumerate(worker_sides):
            self.workers[f"{side}-{i}"] = self.cluster.add_worker(
                1, command=RLFARM_WORKER, prefix=self.part.exec(self._ns(side)), wait=False
            )
        self.stdout = open(self.tmp_path / "trainer.out", "w")
        self.stderr_path = self.tmp_path / "trainer.err"
        self.stderr = open(self.stderr_path, "w")
        self.trainer = subprocess.Popen(
            [
                *self.part.exec(self._ns(trainer_side)),
                *rlfarm_cmd(
                    "train",
                    "--redis",
                    self.cluster.redis_url,
                    "--run-id",
                    self.run_id,
                    "--logdir",
                    str(self.tmp_path),
                    *RUN,
                ),
            ],
            stdout=self.stdout,
            stderr=self.stderr,
            env={**os.environ, **WORKER_ENV},
            start_new_session=True,
        )
        self.cluster.wait_ready()

    def _ns(self, side: str) -> str:
        return self.part.cut_ns if side == "cut" else self.part.kept_ns

    def version(self) -> int:
        raw = self.client.get(keys.latest(self.run_id))
        return -1 if raw is None else int(raw)

    def worker_log(self, name: str) -> str:
        index = self.cluster.worker_procs.index(self.workers[name])
        return (self.cluster.log_dir / f"worker-{index}.log").read_text(errors="replace")

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def pool_identities(self, name: str) -> set[str]:
        """What the worker's pool processes write into the leases they hold (host:pid)."""
        pid = self.workers[name].pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return {f"{socket.gethostname()}:{child}" for child in children}

    def leases_of(self, name: str) -> list[bytes]:
        """The lease keys worker `name`'s pool processes hold now."""
        mine = self.pool_identities(name)
        return [
            k
            for k in self.client.scan_iter(keys.lease(self.run_id, "*"))
            if (self.client.get(k) or b"").decode() in mine
        ]

    def finish(self) -> dict:
        poll(lambda: self.trainer.poll() is not None, "the run to finish", deadline_s=600)
        assert self.trainer.returncode == 0, self.stderr_text()[-3000:]
        return read_summary(self.tmp_path / self.run_id)

    def stop(self) -> None:
        if self.trainer is not None and self.trainer.poll() is None:
            os.killpg(self.trainer.pid, signal.SIGKILL)
            self.trainer.wait()
        for f in ("stdout", "stderr"):
            if hasattr(self, f):
                getattr(self, f).close()
        if hasattr(self, "client"):
            self.client.close()
        self.cluster.stop()


@pytest.fixture
def partition():
    part = Partition()
    try:
        part.make()
        yield part
    finally:
        part.remove()


def _run(
    part: Partition, tmp_path: Path, run_id: str, trainer_side: str, worker_sides: tuple[str, ...], fault=None
) -> tuple[dict, Farm]:
    """The run on a farm in `part`, with `fault(farm)` done mid-run (None: fault-free)."""
    with inside(part.redis):
        farm = Farm(part, tmp_path, run_id)
        try:
            farm.start(trainer_side, worker_sides)
            if fault is not None:
                fault(farm)
            summary = farm.finish()
        finally:
            part.heal()
            farm.stop()
    return summary, farm


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> dict:
    """The same run with no fault: its summary, whose policy digest every partitioned run must match."""
    part = Partition()
    try:
        part.make()
        summary, _ = _run(part, tmp_path_factory.mktemp("fault-free"), "fault-free", "kept", ("kept", "kept"))
    finally:
        part.remove()
    return summary


def _assert_same_run(summary: dict, fault_free: dict) -> None:
    assert summary["env_steps"] == fault_free["env_steps"] == TOTAL_STEPS
    assert_nothing_lost_or_double_counted(summary, STEPS_PER_TASK)
    assert summary["final_version"] == fault_free["final_version"]
    assert summary["policy_sha256"] == fault_free["policy_sha256"]  # the same weights, bit for bit


def _outage_said(text: str) -> bool:
    """The outage's first notice is there (either kind), so the cut side has met it."""
    return "lost Redis at" in text or "did not answer for" in text


@needs_netns
@pytest.mark.farm
@pytest.mark.fault
@pytest.mark.parametrize("how", ["link", "drop"])
def test_a_worker_cut_off_mid_run_is_ridden_out_and_named_unreachable(partition, tmp_path, fault_free, how):
    """The worker in the cut namespace loses Redis while it runs a task (its link down, or every
    packet dropped) for WORKER_OUTAGE_SECONDS: its lease expires, the other worker runs the task
    again, and the cut worker's late copy, pushed once it is back, counts for nothing."""

    def fault(farm: Farm) -> None:
        for _ in range(5):
            held = poll(
                lambda: farm.version() >= 1 and farm.leases_of("cut-0"),
                "the cut worker running a task of the run after its first update",
                farm.trainer,
                deadline_s=300,
            )
            partition.cut(how)
            cut_at = time.monotonic()
            if farm.client.exists(*held):  # its task had not ended (nor its lease been deleted) before the cut
                break
            partition.heal()  # it ended in between: the worker would have nothing to send; again
        else:
            pytest.fail("the cut worker's task ended before every cut")
        poll(
            lambda: _outage_said(farm.worker_log("cut-0")),
            "the cut worker to notice the outage",
            farm.trainer,
            deadline_s=120,
        )
        time.sleep(max(0.0, WORKER_OUTAGE_SECONDS - (time.monotonic() - cut_at)))  # the fault's length
        partition.heal()

    summary, farm = _run(partition, tmp_path, f"cut-worker-{how}", "kept", ("cut", "kept"), fault)
    _assert_same_run(summary, fault_free)
    log = farm.worker_log("cut-0")
    said = [line for line in log.splitlines() if _outage_said(line)]
    assert said and all("it is unreachable" in line for line in said), log[-3000:]
    assert "stalled" not in log and "is back after" in log, log[-3000:]
    assert summary["faults"]["leases_expired"] >= 1  # its task ran again on the other worker


@needs_netns
@pytest.mark.farm
@pytest.mark.fault
@pytest.mark.parametrize("how", ["link", "drop"])
def test_a_trainer_cut_off_past_its_claim_renews_it_before_it_sends(partition, tmp_path, fault_free, how):
    """The trainer loses Redis until its run claim (CLAIM_SECONDS) has expired: once back, it renews
    the claim before it sends a task, so no worker skips one as "the run has no live trainer"."""
    healed_at: dict[str, int] = {}

    def fault(farm: Farm) -> None:
        poll(lambda: farm.version() >= 1, "the run's first update", farm.trainer, deadline_s=300)
        partition.cut(how)
        poll(
            lambda: farm.client.get(keys.claim(farm.run_id)) is None,
            "the trainer's claim to expire",
            farm.trainer,
            deadline_s=120,
        )
        poll(lambda: _outage_said(farm.stderr_text()), "the trainer to notice the outage", farm.trainer, deadline_s=120)
        healed_at.update({name: len(farm.worker_log(name)) for name in farm.workers})
        partition.heal()

    summary, farm = _run(partition, tmp_path, f"cut-trainer-{how}", "cut", ("kept", "kept"), fault)
    _assert_same_run(summary, fault_free)
    stderr = farm.stderr_text()
    said = [line for line in stderr.splitlines() if _outage_said(line)]
    assert said and all("it is unreachable" in line for line in said), stderr[-3000:]
    assert "stalled" not in stderr and "is back after" in stderr, stderr[-3000:]
    assert summary["faults"]["redis_outages"] >= 1
    for name, offset in healed_at.items():
        after = farm.worker_log(name)[offset:]
        assert "no live trainer" not in after, after[-3000:]

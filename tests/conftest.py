"""Shared fixtures: a real redis-server and real Celery worker processes on 127.0.0.1.

They are started with rlfarm.local.cluster.LocalCluster, the code behind the embedded default, and
stopped by pid at the end of the session. Workers get the repository on PYTHONPATH so they can
import the tiny envs in tests/.

Below the fixtures: the helpers more than one test module uses (`from .conftest import ...`); test
modules never import from each other.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from rlfarm.envs import SpaceSpec
from rlfarm.local.cluster import LocalCluster

# Test processes share the cores (the suite runs in parallel): OpenMP threads that wait for work sleep
# instead of spinning, which a CNN learner's second thread did for a fifth of its test's CPU time.
# Set before torch is loaded here or in any process a test starts; results do not depend on it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]
WORKER_ENV = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    # workers build "module:callable" envs from Redis only from allowed modules (rlfarm.envs)
    "RLFARM_ALLOWED_ENV_MODULES": "tests.tiny_envs",
}


# Debian packages some tests need (README: the test command installs them). A test of a tier that
# starts processes fails at once with one line naming what is missing (a failure, which the parallel
# runner reports as any other: stopping the session hid the message behind an INTERNALERROR); unit
# tests, which start nothing, never need them.
SYSTEM_PACKAGES = {  # test module -> (what it needs, how to check)
    "test_compose": [
        ("docker-compose", lambda: shutil.which("docker-compose")),
        ("redis-server (Debian's, with redis-cli)", lambda: shutil.which("redis-cli")),
        ("redis-sentinel", lambda: shutil.which("redis-sentinel")),
    ],
    "test_sentinel": [("redis-sentinel", lambda: shutil.which("redis-sentinel"))],
    "test_security": [
        (
            "redis-server (Debian's /usr/bin/redis-server, built with TLS)",
            lambda: os.access("/usr/bin/redis-server", os.X_OK),
        ),
        ("openssl", lambda: shutil.which("openssl")),
    ],
}
INSTALL_HINT = (
    "On Debian/Ubuntu: sudo apt-get install -y redis-server redis-sentinel docker-compose openssl "
    "(the README's test command does), or run the unit tier alone: python -m pytest -m unit"
)


def missing_system_packages(module: str) -> list[str]:
    return [name for name, present in SYSTEM_PACKAGES.get(module, ()) if not present()]


def fail_for_missing_packages(items) -> None:
    """Tests of a process tier whose module needs a system package that is missing fail in one line."""
    missing: dict[str, list[str]] = {}
    for item in items:
        module = Path(str(item.fspath)).stem
        if module not in SYSTEM_PACKAGES or not any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        if module not in missing:
            missing[module] = missing_system_packages(module)
        if missing[module]:
            text = f"missing system packages: {', '.join(missing[module])}. {INSTALL_HINT}"
            item.runtest = lambda text=text: pytest.fail(text, pytrace=False)


# Test tiers (setup.cfg): a test with none of these is a unit test, and must start no process.
TIERS = ("farm", "fault", "learning", "process")


# The slowest tiers first, so that the parallel runs (setup.cfg: pytest-xdist, `-n auto`) end together
# instead of waiting on one learning run started last.
TIER_ORDER = ("learning", "fault", "farm", "process", "unit")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    fail_for_missing_packages(items)
    for item in items:
        if item.get_closest_marker("learning") and not item.get_closest_marker("deterministic"):
            item.add_marker(pytest.mark.xdist_group(LEARNING_GROUP))
        if {"farm", "redis_only"} & set(item.fixturenames) and not item.get_closest_marker("farm"):
            item.add_marker(pytest.mark.farm)  # the fixtures start redis-server and Celery workers
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
    items.sort(key=run_order)


def run_order(item) -> tuple[int, int]:
    """Learning tests first, then modules kept on one test process (`xdist_group`: long chunks, best
    started early), then by tier. xdist keeps this order only with --no-loadscope-reorder (setup.cfg):
    by default it sends the groups with the most tests first: the learning chain then started 4
    minutes in, on a test process already lowered by the group before it (the ASYNC DQN test took
    243 s instead of ~105)."""
    tier = next(i for i, tier in enumerate(TIER_ORDER) if item.get_closest_marker(tier))
    return (0 if tier == 0 else 1 if item.get_closest_marker("xdist_group") else 2), tier


# Every learning test runs in one test process (`--dist loadgroup`), one after another, and the other
# test processes yield the cores to it (`pytest_runtest_setup`): an ASYNC run's learning depends
# on how fast its results come back, and the learning margins were set with a run alone on the cores.
# A `deterministic` learning test (SYNC: the same bytes however the cores are shared, as the 1-vs-3
# worker tests show) runs in any test process, yielding like the rest: the one learning process's
# chain was the suite's critical path.
LEARNING_GROUP = "learning"
YIELDING_NICENESS = 10  # CFS gives a nice-0 process about 9x the CPU of a nice-10 one


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test starts a server or a worker
def pytest_runtest_setup(item):
    """In the parallel suite, a test process that runs anything but a learning test lowers its own
    priority (and so that of the servers, workers and trainers it starts from then on), for good: the
    learning tests are scheduled first, in one process that is never lowered, and take the cores when
    they need them."""
    learning = item.get_closest_marker("learning") and not item.get_closest_marker("deterministic")
    if os.environ.get("PYTEST_XDIST_WORKER") and not learning:
        if os.getpriority(os.PRIO_PROCESS, 0) < YIELDING_NICENESS:
            os.setpriority(os.PRIO_PROCESS, 0, YIELDING_NICENESS)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two test processes a core. Most farm tests wait on their Redis, workers and
    trainer subprocesses for much of their time, so one a core leaves the cores half idle; three a
    core were slower still on 2 cores (a clean clone's suite: 20:11 against 18:55), every farm test
    stretched by the others' load."""
    return min(16, 2 * (os.cpu_count() or 1))


class StartedAProcess(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(request, monkeypatch):
    """The unit marker is checked: a unit test that starts a process (and so any server) fails, naming
    the tiers it could carry instead."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return

    def refuse(*args, **kwargs):
        raise StartedAProcess(f"a unit test started a process: mark it one of {', '.join(TIERS)} (setup.cfg)")

    real_popen = subprocess.Popen

    class RefusedPopen(real_popen):
        def __new__(cls, *args, **kwargs):  # before an instance exists: no __del__ to trip over
            argv = args[0] if args else kwargs.get("args")
            if isinstance(argv, list | tuple) and argv and os.path.basename(str(argv[0])) == "fc-list":
                # matplotlib's first use by a user builds its font cache with fc-list, once: not the
                # test's process (a fresh machine's quick tier failed on it, issue 51's walk).
                return real_popen(*args, **kwargs)
            refuse()

    import multiprocessing.process

    monkeypatch.setattr(subprocess, "Popen", RefusedPopen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse)
    yield


@pytest.fixture(scope="session", autouse=True)
def _no_local_farm(tmp_path_factory):
    """A developer's own `rlfarm up` farm must not stand in for the embedded default in tests."""
    os.environ["RLFARM_HOME"] = str(tmp_path_factory.mktemp("rlfarm-home"))


@pytest.fixture(scope="session")
def redis_only(tmp_path_factory):
    with LocalCluster(workers=0, name="rlfarm-test-store", log_dir=tmp_path_factory.mktemp("redis")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def farm(tmp_path_factory):
    """Redis + one Celery worker with 2 pool processes."""
    with LocalCluster(
        workers=2, name="rlfarm-test-farm", log_dir=tmp_path_factory.mktemp("farm"), extra_env=WORKER_ENV
    ) as cluster:
        yield cluster


# ---- processes, polling, HTTP --------------------------------------------------------------------
def processes_matching(text: str) -> list[str]:
    """`pid args` lines of the running processes whose command line contains `text`."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped in between: the read fails with ESRCH
        return False


def poll(
    condition, what: str, proc: subprocess.Popen | None = None, log: Path | None = None, deadline_s: float = 120.0
):
    """condition() until it returns something truthy, which is returned; fails with `what` if `proc`
    exits (showing the end of `log`) or the deadline passes first."""
    # Generous deadline: it only turns a hang into a readable failure.
    deadline = time.monotonic() + deadline_s
    while True:
        result = condition()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"{what}: process exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:] if log else ''}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(0.2)  # polling interval, not synchronisation


def http_request(url: str, auth: str | None = None, method: str = "GET") -> urllib.request.Request:
    """A urllib request for `url` with HTTP basic auth `auth` ("user:password") if given; a POST has an
    empty body."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    return request


class TaskEvents:
    """The Celery events of a farm's workers started with -E, as Flower receives them, collected on a
    thread while the `with` block runs. Entering waits until the event stream is live: the receiver
    asks the workers for a heartbeat once it listens, and one arrives."""

    def __init__(self, redis_url: str):
        from rlfarm.farm.app import make_app

        self.app = make_app(redis_url)
        self.events: list[dict] = []
        self._receiver = None
        self._thread = threading.Thread(target=self._capture, name="task-events", daemon=True)

    def _capture(self) -> None:
        with self.app.connection() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self.events.append})
            self._receiver.capture(limit=None, timeout=None, wakeup=True)  # wakeup: workers send a heartbeat

    def __enter__(self) -> TaskEvents:
        self._thread.start()
        poll(lambda: self.of("worker-heartbeat"), "a worker heartbeat in the event stream (workers need -E)")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True  # its loop looks every second
        self._thread.join()
        self.app.close()

    def of(self, kind: str) -> list[dict]:
        return [e for e in list(self.events) if e.get("type") == kind]

    def failed(self) -> dict[str, str]:
        """task id -> the exception of each `task-failed` event (Flower shows those tasks FAILURE)."""
        return {e["uuid"]: e.get("exception", "") for e in self.of("task-failed")}


# ---- the CLI and what a run leaves behind --------------------------------------------------------
def rlfarm_cmd(*args: str) -> list[str]:
    """argv of `rlfarm ARGS` run from this checkout's cli.py."""
    return [sys.executable, str(ROOT / "cli.py"), *args]


def run_cli(*args, env=None, cwd=None):
    """`rlfarm ARGS` to completion, output captured, with WORKER_ENV (plus `env`) in its environment."""
    return run_command(*args, env={**os.environ, **WORKER_ENV, **(env or {})}, cwd=cwd)


def start_command(*args, env=None, cwd=None, stdout=None, stderr=None, text=False, start_new_session=False):
    """`rlfarm ARGS` started, as subprocess.Popen(rlfarm_cmd(ARGS), ...) would start it, with exactly
    `env` (this process's where None): forked like run_command, and signalled by its pid. Its PIPE
    output is read whole by communicate() once it has exited (tests/cli_fork.py)."""
    from .cli_fork import Command

    env = dict(os.environ if env is None else env)
    return Command(args, env, cwd, stdout, stderr, text, start_new_session)


def run_command(*args, env=None, cwd=None, timeout=900) -> subprocess.CompletedProcess:
    """`rlfarm ARGS` to completion with exactly `env` (this process's environment where None), output
    captured as text, as subprocess.run(rlfarm_cmd(ARGS), ...) would: a process of its own, forked from
    one that imported rlfarm and torch once (tests/cli_fork.py)."""
    from .cli_fork import run

    return run([str(a) for a in args], dict(os.environ if env is None else env), cwd=cwd, timeout=timeout)


def train_on(farm, logdir, run_id: str, *args: str) -> subprocess.CompletedProcess:
    """`rlfarm train` of run `run_id` on `farm` (a LocalCluster), its run directory under `logdir`."""
    return run_cli("train", "--redis", farm.redis_url, "--run-id", run_id, "--logdir", str(logdir), *args)


def one_error_line(stderr: str, warnings: bool = True) -> str:
    """The single `rlfarm: error: ...` line a failing command must print (no traceback, nothing else;
    `rlfarm: warning:` lines may come with it unless warnings=False)."""
    lines = [line for line in stderr.splitlines() if line.strip() and not (warnings and "rlfarm: warning:" in line)]
    assert len(lines) == 1 and lines[0].startswith("rlfarm: error: "), stderr[-3000:]
    return lines[0]


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `rlfarm: error:` line a failed command printed on stderr: no warning, no traceback."""
    return one_error_line(result.stderr, warnings=False)


def usage_error_line(result: subprocess.CompletedProcess) -> str:
    """error_line of a command that must have failed as a usage error (exit status 2)."""
    assert result.returncode == 2, result.stderr
    return error_line(result)


def assert_cleaned_up(run_dir: Path, run_id: str) -> None:
    """The embedded Redis and workers of a finished run (cluster.json) are gone, by pid and by name."""
    pids = json.loads((run_dir / "cluster.json").read_text())["pids"]
    assert pids and not [p for p in pids if pid_alive(p)], "a farm process outlived the run"
    # Its workers' node names (rlfarm-RUN-N@host), not a prefix: another test's run may run beside it.
    node = re.compile(rf"rlfarm-{re.escape(run_id)}-\d+@")
    assert [line for line in processes_matching(f"rlfarm-{run_id}-") if node.search(line)] == []


def read_summary(run_dir: Path) -> dict:
    """A run's summary.json."""
    return json.loads((run_dir / "summary.json").read_text())


def assert_nothing_lost_or_double_counted(s: dict, steps_per_result: int) -> None:
    """A run's summary: every accepted task id once, and every env step from exactly one result."""
    ids = s["accepted_task_ids"]
    assert len(ids) == len(set(ids)) == s["unique_task_ids_accepted"]
    # every env step counted comes from exactly one accepted (and not stale-dropped) result
    assert s["env_steps"] == (len(ids) - s.get("dropped_stale", 0)) * steps_per_result


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of one of a run's CSV files (progress.csv, episodes.csv, evals.csv)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def scalar_tags(run_dir: Path) -> dict[str, list[float]]:
    """{tag: values} of the TensorBoard scalars in a run directory, plus "histogram:TAG": [] per histogram."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "histograms": 0}).Reload()
    tags = events.Tags()
    values = {tag: [e.value for e in events.Scalars(tag)] for tag in tags["scalars"]}
    values.update({f"histogram:{tag}": [] for tag in tags["histograms"]})
    return values


# ---- runs, tasks and rollouts in-process ---------------------------------------------------------
def make_run(redis_url: str, run_id: str, overrides: list[str] = (), versions: int = 1):
    """Put a run's metadata and `versions` policy versions into Redis, as the trainer does."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.envs import describe
    from rlfarm.farm.connection import connect
    from rlfarm.farm.policies.store import PolicyStore

    cfg = C.build("cartpole-ppo", [f"run_id={run_id}", *overrides])
    space = describe(cfg.env.id)
    store = PolicyStore(connect(redis_url), run_id, keep=cfg.farm.keep_versions)
    store.set_run_meta({"config": C.to_dict(cfg), "space": space.to_dict()})
    torch.manual_seed(0)
    policy = ActorCritic(space, cfg.policy)
    for v in range(versions):
        store.publish(v, policy.state_dict(), "ppo")
    return cfg, store


def task_channel(redis_url: str, run_id: str, timeout: float = 60.0):
    """A TaskChannel (and its watchdog) for `run_id` on the farm at `redis_url`, no trainer behind it
    (task timeout `timeout`, 3 re-sends)."""
    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect
    from rlfarm.trainer.channel import FarmLink

    return FarmLink(make_app(redis_url), connect(redis_url), run_id, timeout, 3).open()


def task_specs(iteration: int, n: int, steps: int, version: int = 0, seed: int = 1) -> list[dict]:
    """Specs of the `n` rollout tasks of one iteration, as TaskChannel.gather_group takes them."""
    return [{"iteration": iteration, "index": i, "version": version, "steps": steps, "seed": seed} for i in range(n)]


def running_tasks(
    app, run_id: str, started_within: float | None = None, nodes: int | None = None
) -> list[tuple[int, str]]:
    """(pool pid, task id) of the rlfarm rollouts the workers report as executing right now; with
    `started_within`, only those that started at most that many seconds before the reply arrived.
    `nodes`: how many worker nodes reply, so that the call returns with the last reply rather than
    after its whole timeout."""
    from rlfarm.farm.app import ROLLOUT_TASK

    running = []
    for tasks in (app.control.inspect(timeout=0.3, limit=nodes).active() or {}).values():
        now = time.time()  # time_start is wall-clock time, of this same machine
        for t in tasks:
            if t["name"] != ROLLOUT_TASK or t["kwargs"].get("run") != run_id:
                continue
            if started_within is not None and (t.get("time_start") is None or now - t["time_start"] > started_within):
                continue
            running.append((t["worker_pid"], t["id"]))
    return running


class CountValue:
    """A policy double with V(s) = s[0] and always action 0, so every number is hand-computable."""

    spec = SpaceSpec(obs_dim=1, discrete=True, action_dim=2)

    def value(self, obs):
        return obs[:, 0].astype(np.float32)

    def act(self, obs, rng, deterministic=False):
        n = len(obs)
        return np.zeros(n, np.int64), np.zeros(n, np.float32), self.value(obs)


# RLFARM_TEST_CPU=FILE: each test's CPU seconds (its test process's, and of the processes it started
# and reaped), its wall seconds, test process and start time appended to FILE, to find where the
# suite's time goes: the suite is CPU-bound on 2 cores.
CPU_LOG = os.environ.get("RLFARM_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    import resource

    def cpu() -> tuple[float, float]:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

    (own0, kids0), wall0, started = cpu(), time.monotonic(), time.time()
    yield
    (own1, kids1), wall = cpu(), time.monotonic() - wall0
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    with open(CPU_LOG, "a") as f:
        f.write(
            f"{own1 - own0 + kids1 - kids0:.2f}\t{own1 - own0:.2f}\t{kids1 - kids0:.2f}\t{wall:.2f}\t"
            f"{item.nodeid}\t{worker}\t{started:.1f}\n"
        )

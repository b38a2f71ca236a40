"""Shared fixtures: a real redis-server and real Celery worker processes on 127.0.0.1.

They are started with rlfarm.cluster.LocalCluster, the code behind the embedded default, and
stopped by pid at the end of the session. Workers get the repository on PYTHONPATH so they can
import the tiny envs in tests/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlfarm.cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
WORKER_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
              # workers build "module:callable" envs from Redis only from allowed modules (rlfarm.envs)
              "RLFARM_ALLOWED_ENV_MODULES": "tests.tiny_envs"}


# Debian packages some tests need (README: the test command installs them). Checked once the tests
# are collected, so a missing one is reported in the first seconds, not after minutes of tests.
SYSTEM_PACKAGES = {  # test module -> (what it needs, how to check)
    "test_compose": [("docker-compose", lambda: shutil.which("docker-compose")),
                     ("redis-server (Debian's, with redis-cli)", lambda: shutil.which("redis-cli"))],
    "test_security": [("redis-server (Debian's /usr/bin/redis-server, built with TLS)",
                       lambda: os.access("/usr/bin/redis-server", os.X_OK)),
                      ("openssl", lambda: shutil.which("openssl"))],
}


def pytest_collection_finish(session):
    modules = {Path(str(item.fspath)).stem for item in session.items}
    missing = sorted({name for module in modules & set(SYSTEM_PACKAGES)
                      for name, present in SYSTEM_PACKAGES[module] if not present()})
    if missing:
        pytest.exit(f"missing system packages: {', '.join(missing)}. On Debian/Ubuntu: sudo apt-get "
                    f"install -y redis-server docker-compose openssl (the README's test command does), "
                    f"or deselect tests/test_compose.py and tests/test_security.py", returncode=4)


@pytest.fixture(scope="session", autouse=True)
def _no_local_farm(tmp_path_factory):
    """A developer's own `rlfarm up` farm must not stand in for the embedded default in tests."""
    os.environ["RLFARM_HOME"] = str(tmp_path_factory.mktemp("rlfarm-home"))


@pytest.fixture(scope="session")
def redis_only(tmp_path_factory):
    with LocalCluster(workers=0, name="rlfarm-test-store",
                      log_dir=tmp_path_factory.mktemp("redis")) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def farm(tmp_path_factory):
    """Redis + one Celery worker with 2 pool processes."""
    with LocalCluster(workers=2, name="rlfarm-test-farm", log_dir=tmp_path_factory.mktemp("farm"),
                      extra_env=WORKER_ENV) as cluster:
        yield cluster


def processes_matching(text: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def rlfarm_cmd(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "cli.py"), *args]


def make_run(redis_url: str, run_id: str, overrides: list[str] = (), versions: int = 1):
    """Put a run's metadata and `versions` policy versions into Redis, as the trainer does."""
    import torch

    from rlfarm import config as C
    from rlfarm.envs import describe
    from rlfarm.policy import build_policy
    from rlfarm.store import PolicyStore, connect

    cfg = C.build("cartpole-ppo", [f"run_id={run_id}", *overrides])
    space = describe(cfg.env.id)
    store = PolicyStore(connect(redis_url), run_id, keep=cfg.farm.keep_versions)
    store.set_run_meta({"config": C.to_dict(cfg), "space": space.to_dict()})
    torch.manual_seed(0)
    policy = build_policy(space, cfg.policy)
    for v in range(versions):
        store.publish(v, policy.state_dict(), "ppo")
    return cfg, store


def one_error_line(stderr: str) -> str:
    """The single `rlfarm: error: ...` line a failing command must print (no traceback, nothing else)."""
    lines = [line for line in stderr.splitlines() if line.strip() and "rlfarm: warning:" not in line]
    assert len(lines) == 1 and lines[0].startswith("rlfarm: error:"), stderr[-3000:]
    return lines[0]

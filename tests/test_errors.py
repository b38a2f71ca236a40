"""Errors a user meets, as a user meets them: one `rlfarm: error:` line and a non-zero exit, never a
traceback; strict JSON in the run directory; `rlfarm checkpoints delete` for runs Redis keeps forever.

Everything runs the real CLI in subprocesses against real redis-server and Celery worker processes
(tests/conftest.py); the one fake is a TCP server that answers like a web server, not like Redis.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socketserver
import subprocess
import threading

import pytest

from rlfarm import config as C
from rlfarm.farm import keys
from rlfarm.farm.connection import connect
from rlfarm.farm.runs import delete_run, read_status, write_status
from rlfarm.trainer import resume as checkpoint

from .conftest import WORKER_ENV, error_line, make_run, poll, rlfarm_cmd, run_cli

pytestmark = pytest.mark.farm


def keys_of(client, run_id: str) -> set[bytes]:
    return set(client.scan_iter(match=keys.run_pattern(run_id), count=500))


def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as every non-Python JSON reader does."""

    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ---- A.1, A.4: bad input fails before anything starts ----------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--env", "tests.tiny_envs:broken"],
            "env 'tests.tiny_envs:broken' could not be constructed: RuntimeError: simulator licence not found",
        ),
        (["--seed", "-1"], "seed must be a non-negative integer, got -1"),
        (["--set", "seed=-7"], "seed must be a non-negative integer, got -7"),
    ],
)
def test_bad_train_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    result = run_cli("train", "--logdir", str(tmp_path), "--run-id", "bad", *args)
    assert result.returncode == 2
    assert message in error_line(result)
    assert not any(tmp_path.iterdir())  # no run directory, nothing published: nothing started


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--total-steps", "-5"], "invalid value for '--total-steps': -5 is not in the range x>=1 (see "),
        (["worker", "-c", "0"], "invalid value for '-c' / '--concurrency': 0 is not in the range 1<=x<=1024"),
        (["train", "--no-such-option"], "no such option '--no-such-option'"),
        (["no-such-command"], "no such command 'no-such-command'"),
        (["checkpoints", "list", "--bogus"], "no such option '--bogus'"),
    ],
)
def test_click_usage_errors_are_one_line_too(args, message):
    """Bad values caught by click's own types were its four-line usage block; now one line like the
    others, naming `--help` (exit 2, nothing started)."""
    result = run_cli(*args)
    assert result.returncode == 2
    line = error_line(result)
    assert message in line and "--help)" in line, line


def test_eval_of_a_file_that_is_not_a_policy_names_the_file(tmp_path):
    not_policy = tmp_path / "passwd"
    not_policy.write_text("root:x:0:0:root:/root:/bin/bash\n")
    result = run_cli("eval", "--policy", str(not_policy))
    assert result.returncode == 1
    line = error_line(result)
    assert "not a safetensors blob" in line and line.endswith(f"(file {not_policy})")


# ---- A.2: a port that answers, but not as Redis -----------------------------------------------------
class _NotRedis(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(4096)  # the client's first command
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


@pytest.fixture
def not_redis_url():
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _NotRedis)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://:s3cret@127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("command", [["train", "--run-id", "not-redis"], ["worker", "-c", "1"]])
def test_a_port_that_is_not_redis_is_one_line(not_redis_url, tmp_path, command):
    result = run_cli(
        *command, "--redis", not_redis_url, *(["--logdir", str(tmp_path)] if command[0] == "train" else [])
    )
    assert result.returncode == 1
    line = error_line(result)
    port = not_redis_url.rsplit(":", 1)[1]
    assert f"Redis at redis://:***@127.0.0.1:{port} did not answer like a Redis server" in line
    assert "InvalidResponse" in line and "s3cret" not in result.stderr + result.stdout
    assert not any(tmp_path.iterdir())


# ---- A.3: --version is a number or 'latest' ---------------------------------------------------------
@pytest.mark.parametrize("command", [["eval", "--run", "r"], ["checkpoints", "export", "--run", "r", "-o", "x"]])
@pytest.mark.parametrize("version", ["abc", "-1", "1.5"])
def test_a_version_that_is_not_a_number_is_a_usage_error(tmp_path, command, version):
    # Nothing listens on port 1: the error must come before Redis is contacted.
    result = run_cli(*command, "--redis", "redis://127.0.0.1:1/0", "--version", version, cwd=tmp_path)
    assert result.returncode == 2
    assert f"--version must be a non-negative integer or 'latest', got '{version}'" in error_line(result)
    assert not any(tmp_path.iterdir())


# ---- A.5: listing an unknown run ------------------------------------------------------------------
def test_checkpoints_list_of_an_unknown_run_is_an_error(redis_only):
    result = run_cli("checkpoints", "list", "--redis", redis_only.redis_url, "--run", "nosuch")
    assert result.returncode == 1 and result.stdout == ""
    assert f"no run 'nosuch' in Redis at {redis_only.redis_url}" in error_line(result)
    make_run(redis_only.redis_url, "listed", versions=2)
    listed = run_cli("checkpoints", "list", "--redis", redis_only.redis_url, "--run", "listed")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[1] for line in listed.stdout.splitlines() if line.startswith("│")] == ["0", "1"]
    delete_run(connect(redis_only.redis_url), "listed")


# ---- A.6: Ctrl-C on a farm leaves the farm running and says how to continue -------------------------
def test_ctrl_c_on_a_farm_says_how_to_resume(farm, tmp_path):
    run_id = "ctrlc-farm"
    proc = subprocess.Popen(
        rlfarm_cmd(
            "train",
            "--redis",
            farm.redis_url,
            "--run-id",
            run_id,
            "--logdir",
            str(tmp_path),
            "--total-steps",
            "10000000",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **WORKER_ENV},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    progress = tmp_path / run_id / "progress.csv"
    poll(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 2, "a logged iteration", proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate()
    assert proc.returncode == 130, stderr
    command = f"rlfarm train --resume {run_id} --logdir {tmp_path} --redis {farm.redis_url}"
    steps = checkpoint.load(tmp_path / run_id)[1]["env_steps"]
    line = next(line for line in stderr.splitlines() if line.startswith("rlfarm: interrupted"))
    # How many env steps the resumed run collects again: those done since the checkpoint (issue 51).
    match = re.fullmatch(
        rf"rlfarm: interrupted; run {run_id} can continue from its checkpoint at ([\d,]+) env steps "
        rf"\(([\d,]+) of the ([\d,]+) done are collected again\) with: (.*)",
        line,
    )
    assert match and match[4] == command, line
    saved, again, done = (int(match[i].replace(",", "")) for i in (1, 2, 3))
    assert saved == steps and again == done - saved and done >= saved
    assert "workers and Redis stopped" not in stderr
    client = connect(farm.redis_url)  # the farm is not this trainer's to stop
    assert client.ping() and read_status(client, run_id)["state"] != "running"
    # The command it printed works: the run continues from its checkpoint.
    resumed = run_cli(*command.split()[1:], "--total-steps", str(steps + 4096))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert strict_json((tmp_path / run_id / "summary.json").read_text())["env_steps"] == steps + 4096


# ---- B: config.json and summary.json are strict JSON, and read back -------------------------------
def test_json_safe_and_from_dict_round_trip():
    cfg = C.build("cartpole-ppo")
    assert cfg.target_return == math.inf
    text = json.dumps(C.json_safe(C.to_dict(cfg)), allow_nan=False)
    assert strict_json(text)["target_return"] is None
    assert C.from_dict(strict_json(text)) == cfg
    assert C.json_safe({"a": [math.nan, (1.5, -math.inf)], "b": math.inf, "c": 2}) == {
        "a": [None, [1.5, None]],
        "b": None,
        "c": 2,
    }
    with pytest.raises(C.ConfigError, match="ppo.gamma: expected a number, got None"):
        C.from_dict({**C.to_dict(cfg), "ppo": {**C.to_dict(cfg)["ppo"], "gamma": None}})


def test_run_files_are_strict_json_and_resume_reads_them(farm, tmp_path):
    small = [
        "--preset",
        "cartpole-ppo",
        "--set",
        "farm.num_tasks=2",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=512",
        "--set",
        "ppo.num_minibatches=2",
    ]
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "strict",
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "2048",
        *small,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = tmp_path / "strict"
    config = strict_json((run_dir / "config.json").read_text())
    summary = strict_json((run_dir / "summary.json").read_text())
    assert config["target_return"] is None and config["eval"]["interval"] == 20_480
    # No evaluation came due in 2048 steps; the final policy's is the run's only one, so its best.
    assert summary["eval_mean_return"] == summary["best_eval_mean_return"] > 0
    assert summary["env_steps"] == 2048

    resumed = run_cli(
        "train", "--resume", "strict", "--logdir", str(tmp_path), "--redis", farm.redis_url, "--total-steps", "4096"
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    config = strict_json((run_dir / "config.json").read_text())
    assert config["target_return"] is None and config["total_steps"] == 4096
    assert strict_json((run_dir / "summary.json").read_text())["env_steps"] == 4096


# ---- C: rlfarm checkpoints delete ----------------------------------------------------------------
def test_delete_removes_a_finished_run_and_nothing_else(redis_only):
    url = redis_only.redis_url
    client = connect(url)
    make_run(url, "del-done", versions=3)
    write_status(client, "del-done", {"state": "finished", "host": "h", "pid": 1})
    client.rpush(keys.results("del-done"), b"late result")
    make_run(url, "del-done-2", versions=2)  # its prefix starts with the other's name: must be kept
    kept = keys_of(client, "del-done-2")
    assert len(keys_of(client, "del-done")) == 8  # policy:0..2, policy:latest, versions, meta, status, results

    result = run_cli("checkpoints", "delete", "del-done", "--redis", url)
    assert result.returncode == 0, result.stderr
    assert f"deleted run del-done: 8 keys removed from Redis at {url}" in result.stdout
    assert keys_of(client, "del-done") == set()
    assert keys_of(client, "del-done-2") == kept

    again = run_cli("checkpoints", "delete", "del-done", "--redis", url)
    assert again.returncode == 1
    assert f"no run 'del-done' in Redis at {url}" in error_line(again)
    assert delete_run(client, "*") == 0 and delete_run(client, "del-done*") == 0  # ids are literal
    assert keys_of(client, "del-done-2") == kept
    delete_run(client, "del-done-2")


def test_delete_refuses_a_run_with_a_live_trainer_unless_forced(redis_only):
    url = redis_only.redis_url
    client = connect(url)
    make_run(url, "del-live", versions=2)
    write_status(client, "del-live", {"state": "running", "host": "trainer-host", "pid": 4242})
    before = keys_of(client, "del-live")

    refused = run_cli("checkpoints", "delete", "del-live", "--redis", url)
    assert refused.returncode == 1
    assert "run 'del-live' has a live trainer on trainer-host (pid 4242)" in error_line(refused)
    assert "--force" in error_line(refused)
    assert keys_of(client, "del-live") == before

    forced = run_cli("checkpoints", "delete", "del-live", "--redis", url, "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"{len(before)} keys removed" in forced.stdout
    assert keys_of(client, "del-live") == set()

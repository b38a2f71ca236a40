"""What a result holds, judged before it counts (Watchdog.accepts): rewards that are NaN or infinite are
never learned from; the task is sent again, counted towards farm.max_redispatch, so a simulator that
glitched once costs one task and an env that always returns them fails the run in one line. A fault
an env names itself (rlfarm.errors.EnvFault) goes the same way. Real workers on the embedded default;
the envs are tests/tiny_envs.py's."""

from __future__ import annotations

import pytest

from .conftest import read_summary, run_cli

pytestmark = pytest.mark.farm

RUN = [
    "--workers",
    "1",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.num_tasks=2",
    "--set",
    "farm.steps_per_env=256",
    "--set",
    "ppo.num_minibatches=2",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "eval.interval=0",
    "--total-steps",
    "1024",
]


def test_a_result_with_a_nan_reward_is_sent_again_and_never_learned_from(tmp_path):
    marker = tmp_path / "glitched"
    result = run_cli(
        "train",
        "--logdir",
        str(tmp_path),
        "--run-id",
        "glitch",
        "--env",
        "tests.tiny_envs:nan_once",
        *RUN,
        env={"RLFARM_TEST_NAN_MARKER": str(marker)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.exists()  # the glitch happened, once
    summary = read_summary(tmp_path / "glitch")
    assert summary["faults"]["nonfinite_results"] == 1
    assert summary["redispatched"] >= 1 and summary["env_steps"] >= 1024
    assert "with NaN or infinite rewards; sending it again" in result.stderr
    progress = (tmp_path / "glitch" / "progress.csv").read_text().splitlines()
    assert "farm/nonfinite_results" in progress[0].split(",")
    assert all("nan" not in row.split(",")[1:3] for row in progress[1:])


def test_an_env_that_always_returns_nan_rewards_fails_the_run_in_one_line(tmp_path):
    """Its one worker process says why each copy came back unused (a warning a copy), then the error."""
    result = run_cli(
        "train",
        "--logdir",
        str(tmp_path),
        "--run-id",
        "broken",
        "--env",
        "tests.tiny_envs:nan_rewards",
        *RUN,
        "--set",
        "farm.max_redispatch=1",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("rlfarm: error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    line = errors[0]
    assert "was sent 2 times without a result" in line and "with NaN or infinite rewards" in line, line


def test_a_fault_the_env_names_is_sent_again_and_counted_by_its_name(tmp_path):
    marker = tmp_path / "crashed"
    result = run_cli(
        "train",
        "--logdir",
        str(tmp_path),
        "--run-id",
        "crash",
        "--env",
        "tests.tiny_envs:crash_once",
        *RUN,
        env={"RLFARM_TEST_FAULT_MARKER": str(marker)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert marker.exists()  # the crash happened, once
    summary = read_summary(tmp_path / "crash")
    assert summary["faults"]["reported"] == {"simulator_crash": 1}
    assert summary["faults"]["time_limits"] == 0
    assert summary["redispatched"] >= 1 and summary["env_steps"] >= 1024
    assert "EnvFault: simulator_crash: lost its license server; sending it again" in result.stderr


def test_an_env_that_always_faults_fails_the_run_in_one_line(tmp_path):
    result = run_cli(
        "train",
        "--logdir",
        str(tmp_path),
        "--run-id",
        "crashing",
        "--env",
        "tests.tiny_envs:crash_always",
        *RUN,
        "--set",
        "farm.max_redispatch=1",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("rlfarm: error: ")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert "was sent 2 times without a result" in errors[0] and "simulator_crash" in errors[0], errors[0]

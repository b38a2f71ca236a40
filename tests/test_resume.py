"""`rlfarm train --resume RUN` after the trainer was SIGKILLed mid-run (embedded default, CLI in subprocesses)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from rlfarm.trainer import resume as checkpoint

from .conftest import WORKER_ENV, assert_cleaned_up, pid_alive, poll, read_csv, run_cli, start_command

pytestmark = pytest.mark.farm


def start_and_sigkill(tmp_path, run_id: str, args: list[str], kill_after_steps: int) -> dict:
    """Start a training run, SIGKILL its trainer once a checkpoint with >= kill_after_steps env steps
    exists, wait until its embedded Redis and workers are gone; returns that checkpoint's state."""
    proc = start_command(
        "train",
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        *args,
        env={**os.environ, **WORKER_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / run_id

    def checkpointed() -> bool:
        return checkpoint.path_in(run_dir).exists() and checkpoint.load(run_dir)[1]["env_steps"] >= kill_after_steps

    poll(checkpointed, f"a checkpoint of {kill_after_steps} env steps or more, before the run ends", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # Redis and the workers die with their parent (PR_SET_PDEATHSIG); wait for that to happen.
    pids = json.loads((run_dir / "cluster.json").read_text())["pids"]
    try:
        poll(
            lambda: not [p for p in pids if pid_alive(p)], "no farm process outliving its killed trainer", deadline_s=60
        )
    except BaseException:  # say what outlived it, in what state, and what the workers last logged
        for pid in [p for p in pids if pid_alive(p)]:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().split()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(bytes(1), b" ").decode()[:200]
            except OSError:  # gone since
                continue
            print(f"alive: {pid} state {stat[2]} ppid {stat[3]}: {cmdline}")
        for log in sorted(run_dir.glob("worker-*.log")):
            print(f"--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}")
        raise
    _, state = checkpoint.load(run_dir)  # the newest one written before the kill
    return state


def read_steps(path) -> list[int]:
    return [int(r["global_step"]) for r in read_csv(path)]


def test_sync_ppo_resumed_after_sigkill_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
    """Optimizer moments, minibatch RNG, iteration counter and policy all come back: the resumed run
    produces exactly the policy an uninterrupted run with the same seed does."""
    args = [
        "--preset",
        "cartpole-ppo",
        "--workers",
        "2",
        "--seed",
        "7",
        "--total-steps",
        "40960",
        "--set",
        "checkpoint_interval=0",
    ]
    whole = run_cli("train", "--run-id", "whole", "--logdir", str(tmp_path), *args)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = json.loads((tmp_path / "whole" / "summary.json").read_text())

    state = start_and_sigkill(tmp_path, "killed", args, kill_after_steps=16384)
    assert 16384 <= state["env_steps"] < 40960
    resumed = run_cli("train", "--resume", "killed", "--logdir", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from its checkpoint: {state['env_steps']} env steps" in resumed.stdout + resumed.stderr
    run_dir = tmp_path / "killed"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == expected["env_steps"] == 40960
    assert summary["policy_sha256"] == expected["policy_sha256"]
    assert summary["final_version"] == expected["final_version"]
    # The curves read as one run: rows after the checkpoint were dropped and produced again once.
    steps = read_steps(run_dir / "progress.csv")
    assert steps == sorted(set(steps)) and steps[-1] == 40960
    assert steps == read_steps(tmp_path / "whole" / "progress.csv")
    assert_cleaned_up(run_dir, "killed")


def test_async_dqn_resumes_with_its_replay_buffer_and_optimizer(tmp_path):
    args = [
        "--preset",
        "cartpole-dqn",
        "--mode",
        "async",
        "--workers",
        "2",
        "--total-steps",
        "7000",
        "--target-return",
        "1e9",
        "--set",
        "checkpoint_interval=0.5",
    ]
    state = start_and_sigkill(tmp_path, "dqn", args, kill_after_steps=2500)
    killed_at = state["env_steps"]
    assert (
        state["algo"]["replay"]["size"] == killed_at
    )  # every consumed transition was stored (the algorithm owns the buffer)
    resumed = run_cli("train", "--resume", str(tmp_path / "dqn"))  # a run directory works too
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from its checkpoint: {killed_at} env steps" in resumed.stdout + resumed.stderr
    run_dir = tmp_path / "dqn"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 7000
    _, final = checkpoint.load(run_dir)
    assert final["env_steps"] == summary["env_steps"]
    # Restored, not refilled: the buffer holds the transitions from before the kill as well.
    assert final["algo"]["replay"]["size"] == summary["env_steps"]
    # Gradient steps continue from the checkpoint's count (0.5 per env step after learning_starts).
    assert final["algo"]["gradient_steps"] > state["algo"]["gradient_steps"]
    assert final["algo"]["gradient_steps"] >= 0.5 * (summary["env_steps"] - 1000) - 256
    with open(run_dir / "episodes.csv") as f:
        steps = [int(r["global_step"]) for r in csv.DictReader(f)]
    assert steps == sorted(steps) and steps[0] <= killed_at < steps[-1]
    # one progress row per step: none repeated at the resumed step or by the closing log
    progress = read_steps(run_dir / "progress.csv")
    assert progress == sorted(set(progress)) and progress[-1] == summary["env_steps"]
    assert_cleaned_up(run_dir, "dqn")


def test_async_sac_resumes_with_its_critics_alpha_and_replay(tmp_path):
    """SAC's checkpoint (actor, twin critics and targets, log_alpha, three optimizers, its noise
    generator, the replay buffer) goes through the file and back into a resumed run."""
    args = [
        "--preset",
        "pendulum-sac",
        "--workers",
        "2",
        "--total-steps",
        "2400",
        "--target-return",
        "1e9",
        "--set",
        "policy.hidden_sizes=[32,32]",
        "--set",
        "sac.batch_size=64",
        "--set",
        "eval.interval=0",
        "--set",
        "checkpoint_interval=0.5",
    ]
    state = start_and_sigkill(tmp_path, "sac", args, kill_after_steps=1000)
    killed_at = state["env_steps"]
    assert state["algo"]["replay"]["size"] == killed_at and state["algo"]["gradient_steps"] > 0
    resumed = run_cli("train", "--resume", "sac", "--logdir", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"from its checkpoint: {killed_at} env steps" in resumed.stdout + resumed.stderr
    run_dir = tmp_path / "sac"
    summary = json.loads((run_dir / "summary.json").read_text())
    tensors, final = checkpoint.load(run_dir)
    assert final["env_steps"] == summary["env_steps"] >= 2400
    assert final["algo"]["replay"]["size"] == summary["env_steps"]  # restored, not refilled
    # one gradient step per env step after the 100 of heatup, counted on from the checkpoint
    assert final["algo"]["gradient_steps"] >= summary["env_steps"] - 100 - 400
    assert tensors["log_alpha"].item() != 0.0  # alpha moved from its initial 1.0
    assert_cleaned_up(run_dir, "sac")


def test_resume_refuses_config_changes_and_missing_checkpoints(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    for args, message in [
        (["--resume", "nowhere", "--logdir", str(tmp_path)], "no run 'nowhere'"),
        (["--resume", "empty", "--logdir", str(tmp_path)], "has no trainer checkpoint"),
        (["--resume", "empty", "--logdir", str(tmp_path), "--seed", "3"], "--seed cannot change it"),
        (["--resume", "empty", "--logdir", str(tmp_path), "--set", "ppo.gamma=0.9"], "--set cannot"),
    ]:
        result = run_cli("train", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr


def test_an_existing_run_id_is_refused_or_resumed_with_if_exists(tmp_path):
    args = ["--run-id", "again", "--logdir", str(tmp_path), "--total-steps", "4096", "--workers", "1"]
    first = run_cli("train", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    refused = run_cli("train", *args)
    assert refused.returncode == 2 and "run again already exists" in refused.stderr
    # A restarted trainer service: same command plus --if-exists resume, here with more steps to go.
    again = run_cli("train", *args[:-4], "--total-steps", "8192", "--workers", "1", "--if-exists", "resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming it" in again.stderr
    summary = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert summary["env_steps"] == 8192 and summary["final_version"] == 2


def test_a_fresh_run_never_overwrites_policies_of_a_run_in_redis(redis_only, tmp_path):
    """The runs directory was lost but Redis kept the run: a clear error, not a crash loop."""
    from .conftest import make_run

    make_run(redis_only.redis_url, "kept", versions=3)
    result = run_cli("train", "--redis", redis_only.redis_url, "--run-id", "kept", "--logdir", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "run 'kept' already has policies in this Redis (latest v2)" in result.stderr

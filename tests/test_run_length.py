"""How long a run and its episodes really are: SYNC --total-steps rounded UP to whole iterations (and
said so), and a warning when the env's episodes outlast a task (training returns cannot see them)."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from rlfarm import config as C

from .conftest import run_cli

SMALL_PPO = [
    "--set",
    "farm.num_tasks=2",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=512",
    "--set",
    "ppo.num_minibatches=2",
]  # 1,024 env steps per iteration
LONG_EPISODES = "episodes last up to"


@pytest.mark.parametrize(
    "total, iterations, last, note",
    [
        (
            40000,
            10,
            392,
            "--total-steps 40000 is 9.77 iterations of 4096 steps: the last one runs 392 steps per env "
            "(3,136 env steps)",
        ),
        (
            20000,
            5,
            452,
            "--total-steps 20000 is 4.88 iterations of 4096 steps: the last one runs 452 steps per env "
            "(3,616 env steps)",
        ),
        (
            40959,
            10,
            512,
            "--total-steps 40959 is 9.99976 iterations of 4096 steps: the last one runs 512 steps per "
            "env (4,096 env steps), 40,960 env steps in all",
        ),
        (
            1,
            1,
            1,
            "--total-steps 1 is 0.000244141 iterations of 4096 steps: the last one runs 1 step per env "
            "(8 env steps), 8 env steps in all",
        ),
        (4096, 1, 512, None),
        (8192, 2, 512, None),
    ],
)
def test_a_sync_run_ends_at_total_steps_with_a_shorter_last_iteration(total, iterations, last, note):
    """cartpole-ppo: iterations of 2 tasks x 4 envs x 512 steps; the last one runs what is left, rounded
    up to a step of all 8 envs."""
    cfg = C.build("cartpole-ppo", total_steps=total)
    assert cfg.steps_per_iteration == 4096
    assert cfg.num_iterations == iterations
    assert cfg.task_steps(0) == min(512, -(-total // 8))
    done = (iterations - 1) * 4096
    assert cfg.task_steps(done) == last and 0 <= done + last * 8 - total < 8
    assert cfg.rounding_note() == note


def test_async_runs_and_shipped_presets_say_nothing_about_rounding():
    assert C.build("cartpole-dqn", total_steps=40000).rounding_note() is None  # ASYNC: steps, not iterations
    for name in C.preset_names():
        assert C.build(name).rounding_note() is None, name  # presets ship whole iterations


def test_train_ends_at_total_steps_and_says_how_before_it_starts(farm, tmp_path):
    """1,501 steps of 1,024-step iterations (2 tasks x 1 env x 512): a whole iteration, then one of 239
    steps per env, said once before the run: 1,502 env steps (a step of both envs), not 2,048 (sweep
    trials of 20,480 steps trained 24k and 32k). CartPole's 500-step episodes fit in 512-step tasks:
    no episode-length warning."""
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "round-up",
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "1501",
        *SMALL_PPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    note = (
        "rlfarm: --total-steps 1501 is 1.47 iterations of 1024 steps: the last one runs 239 steps per env "
        "(478 env steps), 1,502 env steps in all"
    )
    assert result.stderr.splitlines().count(note) == 1, result.stderr
    assert LONG_EPISODES not in result.stderr
    summary = json.loads((tmp_path / "round-up" / "summary.json").read_text())
    assert summary["env_steps"] == 1502 and summary["final_version"] == 2
    progress = list(csv.DictReader(open(tmp_path / "round-up" / "progress.csv")))
    assert [int(r["global_step"]) for r in progress] == [1024, 1502]
    assert "run round-up: 1502 env steps" in result.stdout
    assert "mean return of the last 20 training episodes" in result.stdout
    # Its final policy was evaluated and kept; with no --target-return there is no target to report.
    [best] = [line for line in result.stdout.splitlines() if line.startswith("best policy: v")]
    assert best.endswith("(best_policy.safetensors)"), best


def test_episodes_longer_than_a_task_are_warned_about(farm, tmp_path):
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "long-episodes",
        "--logdir",
        str(tmp_path),
        "--env",
        "MountainCarContinuous-v0",
        "--total-steps",
        "2048",
        *SMALL_PPO,
        "--set",
        "eval.interval=0",
    )  # scored by its training return: a warning, not a note
    assert result.returncode == 0, result.stderr[-3000:]
    warning = (
        "rlfarm: warning: MountainCarContinuous-v0 episodes last up to 999 steps but each task runs "
        "512 steps per env and starts fresh episodes: training returns only count episodes that end "
        "within a task (at most 512 steps); --set farm.episodes=continue keeps each worker's envs "
        "running across tasks"
    )
    assert result.stderr.splitlines().count(warning) == 1, result.stderr
    # Said before the run directory existed, and still in the run's log, which is what is kept of it.
    log = (tmp_path / "long-episodes" / "rlfarm.log").read_text().splitlines()
    assert any(line.endswith(warning.replace("rlfarm: warning: ", "WARNING rlfarm.cli: ")) for line in log), log
    assert "--total-steps" not in result.stderr  # 2 whole iterations: nothing rounded
    assert "mean return of the last 20 training episodes" in result.stdout
    assert "while exploring" in result.stdout  # not to be read against a greedy evaluation


def test_no_shipped_preset_warns_about_its_own_settings(caplog):
    """cartpole-dqn's 256-step tasks of fresh episodes are on purpose (see its preset): a run that
    evaluates is scored by greedy episodes played whole, so the capped training return is said with -v
    only (four lines on every run was noise: issue 51)."""
    from rlfarm.api import run_length_notes

    caplog.set_level(logging.INFO, logger="rlfarm")
    for name in C.preset_names():
        cfg = C.build(name)  # its checks: errors raise, and nothing may warn
        notes = run_length_notes(cfg)
        assert [note for level, note in notes if level >= logging.WARNING] == [], name
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    [(level, note)] = run_length_notes(C.build("cartpole-dqn"))
    assert level == logging.DEBUG and "act with exploration; greedy evaluations play whole episodes" in note
    [(level, note)] = run_length_notes(C.build("cartpole-dqn", ["eval.interval=0"]))
    assert level == logging.WARNING and "--set farm.episodes=continue" in note  # then the return is the score

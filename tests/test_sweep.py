"""`rlfarm sweep` and `rlfarm train --seeds` through the real farm: trainer subprocesses, Optuna's study
in the farm's Redis, pruning, a failed trial, the files left, and no process left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rlfarm import config as C

from .conftest import WORKER_ENV, pid_alive, poll, read_csv, read_summary, rlfarm_cmd, run_cli

# Tiny CartPole PPO runs: 512 env steps per iteration, a greedy evaluation of 4 episodes every 1024.
TINY = ["--set", "farm.steps_per_env=64", "--set", "eval.interval=1024", "--set", "eval.episodes=4"]
SHORT, LONG = 2048, 40960  # a short trial ends before the pruner's warmup; a long one is pruned past it
SPACE = (
    f'[space]\n"total_steps" = {{ choices = [{SHORT}, {LONG}] }}\n'
    '"ppo.learning_rate" = { low = 1e-3, high = 1e-2, log = true }\n'
)


def optuna():
    return pytest.importorskip("optuna", reason="rlfarm sweep needs Optuna: pip install 'rlfarm[sweep]'")


def enqueued_study(redis_url: str, name: str, trials: list[dict]) -> None:
    """A study in the farm's Redis whose next trials have these params (`rlfarm sweep --resume` runs them)."""
    from rlfarm.tune.study import storage

    study = optuna().create_study(study_name=name, storage=storage(redis_url), direction="maximize")
    for params in trials:
        study.enqueue_trial(params)


def trainers_of(run_prefix: str) -> list[int]:
    """Pids of the `rlfarm train` processes whose --run-id starts with `run_prefix` (from /proc: ps
    cuts long command lines to $COLUMNS)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            args = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if (
            b"--run-id" in args
            and args[args.index(b"--run-id") + 1].decode().startswith(run_prefix)
            and pid_alive(int(entry))
        ):
            pids.append(int(entry))
    return pids


def states(sweep_dir) -> dict[int, dict]:
    return {int(row["number"]): row for row in read_csv(sweep_dir / "trials.csv")}


@pytest.mark.farm
def test_sweep_prunes_long_trials_completes_short_ones_and_best_toml_trains(farm, tmp_path):
    """4 trials, 2 at once: the threshold pruner (warmup 3000 steps) stops both 40960-step trials at
    their evaluation at step 3072 (CartPole returns are at most 500, below 1000); the 2048-step trials
    never reach the warmup and COMPLETE. Deterministic whatever the timing: points are checked in order."""
    name = "sw-prune"
    enqueued_study(
        farm.redis_url,
        name,
        [
            {"total_steps": LONG, "ppo.learning_rate": 3e-3},
            {"total_steps": SHORT, "ppo.learning_rate": 3e-3},
            {"total_steps": LONG, "ppo.learning_rate": 5e-3},
            {"total_steps": SHORT, "ppo.learning_rate": 1e-3},
        ],
    )
    (tmp_path / "space.toml").write_text(SPACE)
    result = run_cli(
        "sweep",
        "--resume",
        name,
        "--redis",
        farm.redis_url,
        "--space",
        str(tmp_path / "space.toml"),
        "--trials",
        "4",
        "--parallel",
        "2",
        "--pruner",
        "threshold",
        "--prune-below",
        "1000",
        "--prune-warmup",
        "3000",
        *TINY,
        "--logdir",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    sweep_dir = tmp_path / name
    trials = states(sweep_dir)
    assert {n: t["state"] for n, t in trials.items()} == {0: "PRUNED", 1: "COMPLETE", 2: "PRUNED", 3: "COMPLETE"}
    assert "mean" not in result.stdout and "trial 0 PRUNED at step 3072" in result.stdout
    for n in (0, 2):  # stopped mid-run: no summary, and far from its 40960 steps
        run_dir = sweep_dir / f"{name}-t{n}"
        assert not (run_dir / "summary.json").exists()
        assert max(int(r["global_step"]) for r in read_csv(run_dir / "progress.csv")) < LONG
    for n in (1, 3):  # the score is the run's best greedy evaluation
        assert float(trials[n]["value"]) == read_summary(sweep_dir / f"{name}-t{n}")["best_eval_mean_return"]
        assert trials[n]["run_id"] == f"{name}-t{n}"
    from rlfarm.tune.study import storage

    study = optuna().load_study(study_name=name, storage=storage(farm.redis_url))
    assert [t.state.name for t in study.trials] == ["PRUNED", "COMPLETE", "PRUNED", "COMPLETE"]
    best_n = max((1, 3), key=lambda n: float(trials[n]["value"]))
    best = sweep_dir / "best.toml"
    cfg = C.build(str(best))
    assert cfg.total_steps == SHORT and cfg.ppo.learning_rate == float(trials[best_n]["ppo.learning_rate"])
    assert cfg.farm.steps_per_env == 64 and cfg.eval.interval == 1024  # the sweep's --set are in it
    assert trainers_of(f"{name}-t") == []  # every trainer is gone, the pruned ones too
    again = run_cli(
        "train",
        "--preset",
        str(best),
        "--redis",
        farm.redis_url,
        "--total-steps",
        "512",
        "--run-id",
        "from-best",
        "--logdir",
        str(tmp_path),
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert read_summary(tmp_path / "from-best")["env_steps"] == 512


@pytest.mark.fault
def test_a_trial_whose_trainer_is_sigkilled_fails_and_the_sweep_finishes_the_others(farm, tmp_path):
    name = "sw-kill"
    enqueued_study(
        farm.redis_url,
        name,
        [
            {"total_steps": LONG, "ppo.learning_rate": 3e-3},
            {"total_steps": SHORT, "ppo.learning_rate": 3e-3},
            {"total_steps": SHORT, "ppo.learning_rate": 5e-3},
        ],
    )
    (tmp_path / "space.toml").write_text(SPACE)
    log = tmp_path / "sweep.log"
    with open(log, "w") as out:
        sweep = subprocess.Popen(
            rlfarm_cmd(
                "sweep",
                "--resume",
                name,
                "--redis",
                farm.redis_url,
                "--space",
                str(tmp_path / "space.toml"),
                "--trials",
                "3",
                "--parallel",
                "2",
                "--pruner",
                "none",
                *TINY,
                "--logdir",
                str(tmp_path),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **WORKER_ENV},
        )
    try:
        victim = tmp_path / name / f"{name}-t0"
        poll(
            lambda: (victim / "evals.csv").is_file() and len(read_csv(victim / "evals.csv")) >= 1,
            "trial 0 evaluated once",
            sweep,
            log,
        )
        [pid] = trainers_of(f"{name}-t0")
        os.kill(pid, signal.SIGKILL)
        assert sweep.wait(timeout=600) == 1, log.read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
    trials = states(tmp_path / name)
    assert {n: t["state"] for n, t in trials.items()} == {0: "FAIL", 1: "COMPLETE", 2: "COMPLETE"}
    assert trials[0]["fail_reason"] == "trainer killed by SIGKILL"
    output = log.read_text()
    assert "trial 0 FAIL: value" in output and "rlfarm: error: trial 0 failed" in output
    assert not pid_alive(pid) and trainers_of(f"{name}-t") == []


@pytest.mark.farm
def test_seeds_train_two_runs_on_one_embedded_farm_with_mean_and_std(tmp_path):
    result = run_cli(
        "train", "--seeds", "1,2", "--total-steps", "2048", *TINY, "--run-id", "tiny", "--logdir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "tiny-seeds" / "summary.json").read_text())
    assert summary["seeds"] == [1, 2] and summary["failed"] == []
    best = [read_summary(tmp_path / f"tiny-s{s}")["best_eval_mean_return"] for s in (1, 2)]
    assert [r["scores"]["best_eval_mean_return"] for r in summary["runs"]] == best
    assert summary["mean"]["best_eval_mean_return"] == pytest.approx(np.mean(best))
    assert summary["std"]["best_eval_mean_return"] == pytest.approx(np.std(best))
    assert [json.loads((tmp_path / f"tiny-s{s}" / "config.json").read_text())["seed"] for s in (1, 2)] == [1, 2]
    assert "tiny-s1" in result.stdout and "tiny-s2" in result.stdout and "mean ± std" in result.stdout
    assert f"{np.mean(best):.1f} ± {np.std(best):.1f}" in result.stdout
    pids = json.loads((tmp_path / "tiny-seeds" / "farm" / "cluster.json").read_text())["pids"]
    assert pids and not [p for p in pids if pid_alive(p)]  # the one embedded farm is stopped
    assert trainers_of("tiny-s") == []


@pytest.mark.farm
def test_seeds_with_parallel_1_train_one_after_another(tmp_path):
    """Waves: with --parallel 1 each seed's trainer starts once the one before has exited, as the start
    and end times in summary.json show (the end is when the parent saw the exit, so no overlap is real).
    The preset as shipped (no --set eval.*): no evaluation comes due in 512 steps, but each run evaluates
    its final policy, so the table's best and final greedy evaluation columns are filled."""
    result = run_cli(
        "train",
        "--seeds",
        "1-3",
        "--parallel",
        "1",
        "--total-steps",
        "512",
        "--set",
        "farm.steps_per_env=64",
        "--run-id",
        "wave",
        "--logdir",
        str(tmp_path),
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "training 3 seeds (1-3) 1 at a time" in result.stderr
    summary = json.loads((tmp_path / "wave-seeds" / "summary.json").read_text())
    runs = summary["runs"]
    assert [r["seed"] for r in runs] == [1, 2, 3] and {r["state"] for r in runs} == {"finished"}
    assert all(r["started_at"] < r["ended_at"] for r in runs)
    assert all(a["ended_at"] <= b["started_at"] for a, b in zip(runs, runs[1:]))
    assert trainers_of("wave-s") == []

    for r in runs:  # one evaluation, of the final policy: the best one too
        scores = r["scores"]
        assert scores["best_eval_mean_return"] == scores["eval_mean_return"] > 0, r
        assert (tmp_path / r["run_id"] / "best_policy.safetensors").exists()
        row = next(line for line in result.stdout.splitlines() if r["run_id"] in line)
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        assert cells[3] == cells[4] == f"{scores['eval_mean_return']:.1f}", row  # best eval, final eval
    assert summary["mean"]["best_eval_mean_return"] is not None
    mean_row = next(line for line in result.stdout.splitlines() if "mean ± std" in line)
    cells = [c.strip() for c in mean_row.strip("│ ").split("│")]
    assert "±" in cells[3] and "±" in cells[4], mean_row


def test_sweep_refuses_bad_input_in_one_line_before_anything_starts(tmp_path, monkeypatch):
    from cli import main

    def error(*args):
        result = CliRunner().invoke(main, ["sweep", *args])
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        return line

    space = tmp_path / "space.toml"
    space.write_text('[space]\n"ppo.learnig_rate" = { low = 1e-4, high = 1e-2 }\n')
    assert error("--space", str(space)).startswith("rlfarm: error: space key 'ppo.learnig_rate': unknown config key")
    assert error("--space", str(tmp_path / "none.toml")) == f"rlfarm: error: no space file {tmp_path / 'none.toml'}"
    assert "--resume needs --redis URL" in error("--space", str(space), "--resume", "s")
    assert "--pruner threshold needs --prune-below" in error("--space", str(space), "--pruner", "threshold")
    space.write_text('[space]\n"ppo.clip_coef" = { low = 0.1, high = 0.3 }\n')
    assert "--metric eval needs greedy evaluations" in error(
        "--space", str(space), "--metric", "eval", "--set", "eval.interval=0"
    )
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)  # as if not installed
    assert error("--space", str(space)) == (
        "rlfarm: error: rlfarm sweep needs Optuna, which is not installed: pip install 'rlfarm[sweep]'"
    )


def test_optuna_dashboard_opens_a_sweeps_study_by_the_farms_redis_url(redis_only, tmp_path):
    """What docs/sweeps.md says to type: `optuna-dashboard REDIS_URL` shows the studies `rlfarm sweep`
    keeps in the farm's Redis (Optuna's journal storage, default prefix)."""
    import shutil
    import urllib.request

    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed (pip install optuna-dashboard)")
    from rlfarm.local.cluster import free_port
    from rlfarm.tune.study import make_pruner, open_study

    study = open_study(redis_only.redis_url, "dash", False, make_pruner("none", 0, 1), seed=1)
    for value in (10.0, 30.0):
        trial = study.ask()
        trial.suggest_float("ppo.learning_rate", 1e-4, 1e-2, log=True)
        study.tell(trial, value)
    port = free_port()
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
    log = tmp_path / "dashboard.log"
    proc = subprocess.Popen(
        [exe, redis_only.redis_url, "--host", "127.0.0.1", "--port", str(port)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:

        def studies():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as r:
                    return json.loads(r.read())["study_summaries"]
            except OSError:
                return None

        found = poll(studies, "optuna-dashboard answering on the study's Redis", proc=proc, log=log)
        dash = [s for s in found if s["study_name"] == "dash"]
        assert len(dash) == 1
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies/{dash[0]['study_id']}", timeout=5) as r:
            detail = json.loads(r.read())
        assert sorted(t["values"][0] for t in detail["trials"]) == [10.0, 30.0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class ExitedTrainer:
    """A trainer that has already exited with `code` (what Sweep._watch asks of one)."""

    seconds = 1.0

    def __init__(self, code):
        self.code, self.stopped = code, False

    def poll(self):
        return self.code

    def stop(self):
        self.stopped = True


class Points:
    """A curve whose points are all on disk at the first read."""

    def __init__(self, points):
        self.points, self._new = [], list(points)

    def read(self):
        new, self._new = self._new, []
        self.points += new
        return new


@pytest.mark.parametrize(
    "points, code, total, state",
    [
        ([(1024, 5.0), (2048, 9.0)], None, 2048, "PRUNED"),  # below the threshold mid-run: pruned at 1024
        ([(2048, 9.0)], None, 2048, "RUNNING"),  # its report at the run's total steps never prunes
        ([(2048, 9.0), (2048, 9.5)], 0, 4096, "COMPLETE"),  # an exited run's last point (target reached)
        ([(2048, 9.0), (3072, 8.0)], 0, 4096, "PRUNED"),  # ... but not an earlier one
    ],
)
def test_a_point_at_the_runs_end_never_prunes_its_trial(tmp_path, points, code, total, state):
    """Before, a trial whose report at its final step fell below the threshold was PRUNED although its
    run had finished; now the run's end (total steps, or the last point once the trainer exited 0)
    COMPLETES it, scored as any finished run."""
    from rlfarm.tune.sweep import Sweep, SweepPlan, TrialRun

    module = optuna()
    module.logging.set_verbosity(module.logging.WARNING)
    study = module.create_study(direction="maximize", pruner=module.pruners.ThresholdPruner(lower=1000))
    trial = study.ask()
    run = TrialRun(trial.number, {}, "r", trial, ExitedTrainer(code), Points(points), final_step=total)
    sweep = Sweep(study, [], [], SweepPlan(trials=1, parallel=1, metric="return"), tmp_path, {})
    sweep._watch(run)
    assert run.state == state and study.trials[0].state.name == state
    assert run.trainer.stopped == (state == "PRUNED")
    if state == "COMPLETE":
        assert study.trials[0].value == max(v for _, v in points)

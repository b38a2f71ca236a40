"""The CLI as a user types it, in subprocesses: bad input, external Redis, eval, checkpoints, Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
from click.testing import CliRunner

from cli import main

from .conftest import WORKER_ENV, assert_cleaned_up, poll, processes_matching, rlfarm_cmd, run_cli


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["train"],
        ["worker"],
        ["eval"],
        ["checkpoints"],
        ["checkpoints", "list"],
        ["checkpoints", "export"],
        ["checkpoints", "delete"],
        ["presets"],
        ["status"],
        ["plot"],
        ["sweep"],
    ],
)
def test_help_on_every_command(command):
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output
    assert len(result.output.splitlines()) > 4


def test_presets_lists_each_with_a_line():
    result = CliRunner().invoke(main, ["presets"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert any(line.startswith("cartpole-ppo ") for line in lines)
    assert any(line.startswith("pendulum-ppo ") for line in lines)
    assert any(line.startswith("pendulum-sac ") for line in lines)


@pytest.mark.process
@pytest.mark.parametrize(
    "args, message",
    [
        (["--env", "CartPol-v1"], "unknown env 'CartPol-v1'; did you mean CartPole-v1"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--set", "ppo.gama=0.9"], "unknown config key 'ppo.gama' (did you mean ppo.gamma?)"),
        (["--set", "seed=x"], "seed: expected an integer"),
        (["--mode", "async", "--set", "ppo.rho_bar=0"], "ppo.rho_bar must be positive, got 0.0"),
        (["--mode", "async", "--set", "ppo.c_bar=-1"], "ppo.c_bar must be positive, got -1.0"),
        (
            ["--mode", "async", "--set", "async.max_policy_lag=-1"],
            "async.max_policy_lag and eval.interval cannot be negative",
        ),
        (
            ["--mode", "async", "--set", "async.results_per_update=-1"],
            "async.results_per_update and async.tasks_in_flight cannot be negative",
        ),
        (["--redis", "redis://127.0.0.1:1/0"], "cannot reach Redis at redis://127.0.0.1:1/0"),
        # Settings of games and multi-agent envs on an env that is neither were ignored in silence.
        (["--set", "selfplay.league_size=3"], "selfplay.* settings are for turn-based games; env 'CartPole-v1'"),
        (["--set", "env.policy_map=['*=a']"], "env.policy_map is for multi-agent envs; env 'CartPole-v1'"),
        (["--env", "x" * 100_000], "env.id is 100,000 characters long, above its bound of 256"),
        (["--set", "seed=" + "[" * 3000 + "]" * 3000], "the value of override seed nests tables or arrays"),
        (["--set", "ppo.num_minibatches=3"], "must divide the steps per iteration"),
        (["--preset", "cartpole-dqn", "--mode", "sync"], "algo 'dqn' cannot run in --mode sync"),
        (["--preset", "cartpole-dqn", "--env", "Pendulum-v1"], "needs a discrete action space"),
        (["--preset", "pendulum-sac", "--mode", "sync"], "algo 'sac' cannot run in --mode sync"),
        (
            ["--preset", "pendulum-sac", "--env", "CartPole-v1"],
            "algo 'sac' needs a Box (continuous) action space, the env has 2 discrete actions; use ppo or dqn",
        ),
        (
            ["--preset", "pendulum-sac", "--env", "tests.tiny_envs:unbounded"],
            "algo 'sac' scales its tanh-squashed actions to the action space's bounds and needs finite ones",
        ),
        (["--preset", "pendulum-sac", "--set", "sac.tau=1.5"], "sac.tau must be in (0, 1], got 1.5"),
        (["--preset", "pendulum-sac", "--set", "sac.replay_ratio=-1"], "sac.replay_ratio cannot be negative"),
        # issue 32's audit: each was accepted, and started processes or allocated until something broke
        (["--seeds", "1-100000"], "the range 1-100000 is 100,000 seeds, more than the 1,000 one command may train"),
        (["--set", "env.num_envs=100000"], "env.num_envs = 100,000 is above its bound of 4,096"),
        (["--set", "ppo.learning_rate=1e6"], "ppo.learning_rate = 1e+06 is outside (0, 1]"),
    ],
)
def test_bad_input_fails_before_dispatch(tmp_path, args, message):
    result = run_cli("train", "--logdir", str(tmp_path), *args)
    assert result.returncode != 0
    err_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(err_lines) == 1 and err_lines[0].startswith("rlfarm: error:"), result.stderr
    assert message in err_lines[0]
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


# `rlfarm train ARGS`, then whether torch was imported and the exit code.
TORCH_PROBE = """
import sys
from rlfarm.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    print("torch" in sys.modules, exit.code)
"""


@pytest.mark.process
@pytest.mark.parametrize(
    "args",
    [
        ["--set", "ppo.learning_rate=1e6"],
        ["--env", "CartPol-v1"],
        ["--preset", "pendulum-sac", "--env", "CartPole-v1"],
        ["--redis", "redis://127.0.0.1:1/0"],
    ],
)
def test_bad_train_input_is_refused_before_torch_is_imported(tmp_path, args):
    """A typo costs a fraction of a second, not torch's import (seconds of CPU on a small machine)."""
    import os
    import sys

    result = subprocess.run(
        [sys.executable, "-c", TORCH_PROBE, "train", "--logdir", str(tmp_path), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **WORKER_ENV},
        timeout=300,
    )
    imported, code = result.stdout.split()
    assert code != "0" and "rlfarm: error:" in result.stderr, result.stderr
    assert imported == "False"


def test_train_on_external_redis_then_checkpoints_and_eval(farm, tmp_path):
    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "cli-ext",
        "--total-steps",
        "4096",
        "--logdir",
        str(tmp_path),
        "--set",
        "farm.keep_versions=3",
        "--set",
        "farm.num_tasks=2",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=512",
        "--set",
        "ppo.num_minibatches=4",  # 4 iterations of 1024 steps: v0..v4
        "--set",
        "eval.interval=2048",
        "--set",
        "eval.episodes=4",
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "cli-ext"
    for name in ("config.json", "progress.csv", "episodes.csv", "final_policy.safetensors", "summary.json"):
        assert (run_dir / name).exists(), name
    assert list(run_dir.glob("events.out.tfevents.*"))
    # Greedy evaluations ran off the training path, at 2048 and 4096 steps (the last: final policy).
    evals = (run_dir / "evals.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in evals[1:]] == ["2048", "4096"]
    assert all(line.split(",")[4] == "4" for line in evals[1:])
    assert "greedy evaluation" in result.stdout
    header = (run_dir / "progress.csv").read_text().splitlines()[0]
    for key in ("charts/SPS", "charts/episodic_return", "losses/value_loss", "losses/approx_kl"):
        assert key in header

    listing = run_cli("checkpoints", "list", "--redis", farm.redis_url, "--run", "cli-ext")
    assert listing.returncode == 0
    assert [line.split()[1] for line in listing.stdout.splitlines() if line.startswith("│")] == ["2", "3", "4"]

    out = tmp_path / "v3.safetensors"
    exported = run_cli(
        "checkpoints", "export", "--redis", farm.redis_url, "--run", "cli-ext", "--version", "3", "-o", str(out)
    )
    assert exported.returncode == 0 and out.exists()
    for source in (
        ["--policy", str(out)],
        ["--policy", str(run_dir / "final_policy.safetensors")],
        ["--run", "cli-ext", "--redis", farm.redis_url],
    ):
        ev = run_cli("eval", *source, "--episodes", "3")
        assert ev.returncode == 0, ev.stderr
        assert "mean return" in ev.stdout and "over 3 greedy episodes" in ev.stdout

    gone = run_cli("eval", "--run", "cli-ext", "--version", "0", "--redis", farm.redis_url)
    assert gone.returncode == 1 and "version 0 was trimmed" in gone.stderr


@pytest.mark.farm  # the embedded default: its own redis-server and workers
@pytest.mark.parametrize("fork", ["1", "0"])
def test_ctrl_c_stops_everything(tmp_path, fork):
    """Also: the embedded worker, forked from the trainer (RLFARM_FORK_WORKERS=1, the default) or
    started from a fresh interpreter (0), is the trainer's child, shown by `ps` with its node name,
    and holds none of the trainer's files: not the run directory's lock (a resume after a SIGKILLed
    trainer would find the run in use), not the trainer's stdout and stderr pipes (its caller would
    wait for their end as long as the worker lives)."""
    import json
    import os
    from pathlib import Path

    run = f"ctrlc-fork{fork}"  # the two cases run at once: each its own node names
    # Started with SIGINT ignored, as a background job of a non-interactive shell is (and as this
    # test's own process may be): Ctrl-C / kill -INT must still stop the run.
    proc = subprocess.Popen(
        rlfarm_cmd("train", "--run-id", run, "--logdir", str(tmp_path), "--total-steps", "10000000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **WORKER_ENV, "RLFARM_FORK_WORKERS": fork},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    progress = tmp_path / run / "progress.csv"
    poll(lambda: progress.exists() and len(progress.read_text().splitlines()) >= 3, "training under way", proc)

    def links(pid: int) -> dict[int, str]:
        fds = Path(f"/proc/{pid}/fd")
        return {int(fd.name): os.readlink(fd) for fd in fds.iterdir()}

    worker = json.loads((tmp_path / run / "cluster.json").read_text())["pids"][1]
    assert int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid
    assert f"rlfarm-{run}-0@" in Path(f"/proc/{worker}/cmdline").read_bytes().decode(errors="replace")
    held = links(worker)
    trainer = links(proc.pid)
    assert held[0] == os.devnull and held[1] == held[2] == str(tmp_path / run / "worker-0.log")
    assert not [path for path in held.values() if path.endswith("trainer.lock")], held
    assert not {trainer[1], trainer[2]} & set(held.values()), (trainer, held)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    # One worker of N rollout processes, as `ps` shows it (issue 51: "2 worker processes" with 3 running)
    assert re.search(r"starting an embedded Redis and a local worker of \d+ rollout processes", stderr), stderr
    # The embedded default says how to continue too (issue 51: it printed no resume hint).
    assert f"rlfarm: interrupted; workers and Redis stopped; run {run} can continue from its checkpoint at" in stderr
    assert f"with: rlfarm train --resume {run} --logdir {tmp_path}" in stderr
    assert_cleaned_up(tmp_path / run, run)


def test_rlfarm_worker_joins_a_farm(redis_only, tmp_path):
    """`rlfarm worker --redis URL` is a real Celery worker that runs rollouts for the trainer."""
    import os

    from rlfarm.farm.app import make_app
    from rlfarm.farm.connection import connect
    from rlfarm.trainer.channel import FarmLink

    from .conftest import make_run

    make_run(redis_only.redis_url, "joined")
    log = open(tmp_path / "worker.log", "w")
    proc = subprocess.Popen(
        rlfarm_cmd("worker", "--redis", redis_only.redis_url, "-c", "1", "-n", "rlfarm-joined@%h", "-l", "WARNING"),
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **WORKER_ENV},
        start_new_session=True,
    )
    try:
        d = FarmLink(make_app(redis_only.redis_url), connect(redis_only.redis_url), "joined", 120, 1).open()
        results = d.gather_group([{"iteration": 0, "index": i, "version": 0, "steps": 16, "seed": 1} for i in range(3)])
        assert [r.index for r in results] == [0, 1, 2]
        assert {r.worker.split(":")[1] for r in results} - {str(proc.pid)}  # ran in a pool child
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    assert processes_matching("rlfarm-joined@") == []


def _eval_error(args: list[str], code: int) -> str:
    """The one `rlfarm: error:` line of `rlfarm eval ARGS`, run in-process (unit tier: nothing starts)."""
    result = CliRunner().invoke(main, ["eval", *args])
    assert result.exit_code == code, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("rlfarm: error: "), line
    return line


def test_eval_of_a_run_that_does_not_exist_names_where_it_looked(tmp_path):
    line = _eval_error(["nope", "--logdir", str(tmp_path)], 1)
    assert (
        line
        == f"rlfarm: error: no run 'nope': neither nope/ nor {tmp_path}/nope/ is a run directory (one with config.json)"
    )
    assert "runs/nope/" in _eval_error(["nope"], 1)  # --logdir's default


def test_eval_of_a_run_without_a_policy_file_says_what_to_play_instead(tmp_path):
    (tmp_path / "young").mkdir()
    (tmp_path / "young" / "config.json").write_text("{}")
    line = _eval_error([str(tmp_path / "young")], 1)
    assert "run young has no policy file yet (no best_policy.safetensors or final_policy.safetensors in" in line
    assert line.endswith("play its newest version with --run young")


@pytest.mark.parametrize(
    "args, fragment",
    [
        ([], "give exactly one of RUN (a run directory's best policy), --policy FILE or --run RUN (Redis)"),
        (["r1", "--run", "r2"], "give exactly one of RUN"),
        (["r1", "--version", "3"], "--version picks a version of --run RUN in Redis"),
        (["--run", "r2", "--logdir", "x"], "--logdir is where RUN's directory is; give it with RUN"),
    ],
)
def test_eval_forms_that_do_not_go_together_are_one_line(args, fragment):
    assert fragment in _eval_error(args, 2)

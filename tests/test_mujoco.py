"""MuJoCo through the farm (the mujoco extra: `pip install -e ".[mujoco]"`; .ci/run installs it):
continuous control with normalised observations, continued 1000-step episodes, and a clear line
when the extra is missing."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from rlfarm.core import codec

from .conftest import ROOT, WORKER_ENV, one_error_line, read_csv, run_cli


@pytest.fixture(scope="module", autouse=True)
def needs_mujoco():
    pytest.importorskip("mujoco", reason='the mujoco extra is not installed: pip install -e ".[mujoco]"')


def test_halfcheetah_ppo_trains_through_the_cli_with_normalised_observations(farm, tmp_path):
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        "halfcheetah-ppo",
        "--total-steps",
        "6144",
        "--set",
        "eval.episodes=1",
        "--run-id",
        "cheetah",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [row for row in read_csv(tmp_path / "cheetah" / "progress.csv") if int(row["policy_version"]) > 0]
    assert rows and all(math.isfinite(float(row["losses/value_loss"])) for row in rows)
    # 6144 steps on 2 processes: every stream plays past 1000 steps, so whole episodes are reported
    episodes = read_csv(tmp_path / "cheetah" / "episodes.csv")
    assert episodes and {int(e["episodic_length"]) for e in episodes} == {1000}
    state, _ = codec.decode_policy((tmp_path / "cheetah" / "final_policy.safetensors").read_bytes())
    assert state["obs_norm.count"].item() == 6144  # the statistics travel in the policy itself
    assert state["obs_norm.var"].min().item() > 0 and state["obs_norm.mean"].abs().max().item() > 0


@pytest.mark.process
def test_a_mujoco_preset_without_the_extra_is_one_line_saying_what_to_install(tmp_path):
    blocked = "import sys; sys.modules['mujoco'] = None; sys.argv[0] = 'rlfarm'; import cli; cli.entry()"
    r = subprocess.run(
        [sys.executable, "-c", blocked, "train", "--preset", "halfcheetah-ppo", "--logdir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, **WORKER_ENV},
    )
    assert r.returncode != 0
    assert 'needs the mujoco extra, which is not installed: pip install -e ".[mujoco]"' in one_error_line(r.stderr)


def test_halfcheetah_sac_trains_through_the_cli(farm, tmp_path):
    """A few thousand steps of the halfcheetah-sac preset on real workers: heatup, then SAC's gradient
    steps with finite losses, and whole 1000-step episodes reported from continued streams."""
    r = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        "halfcheetah-sac",
        "--total-steps",
        "3000",
        "--set",
        "sac.learning_starts=1000",
        "--set",
        "sac.replay_ratio=0.25",  # 500 gradient steps
        "--set",
        "eval.interval=0",
        "--set",
        "eval.episodes=1",
        "--run-id",
        "cheetah-sac",
        "--logdir",
        str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [
        row
        for row in read_csv(tmp_path / "cheetah-sac" / "progress.csv")
        if not math.isnan(float(row["losses/qf_loss"]))
    ]
    assert rows and all(
        math.isfinite(float(row[key]))
        for row in rows
        for key in ("losses/qf_loss", "losses/actor_loss", "losses/alpha")
    )
    episodes = read_csv(tmp_path / "cheetah-sac" / "episodes.csv")
    assert episodes and {int(e["episodic_length"]) for e in episodes} == {1000}

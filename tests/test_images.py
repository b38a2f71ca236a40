"""Image observations through the farm: uint8 from the env to the learner, a CNN chosen from the
observation space, in SYNC and in ASYNC, on real Redis and Celery workers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from rlfarm.core import codec
from rlfarm.core.rollout import Rollout

from .conftest import WORKER_ENV, make_run, run_command, task_channel, task_specs

IMAGE_ENV = "tests.tiny_envs:image"  # 2x16x16 uint8, CHW


def test_results_carry_uint8_images(farm):
    make_run(farm.redis_url, "pixels", [f"env.id={IMAGE_ENV}", "env.num_envs=2", "policy.cnn_features=32"])
    results = task_channel(farm.redis_url, "pixels").gather_group(task_specs(0, 2, 32))
    for result in results:
        rollout = Rollout.from_dict(result.rollout)
        assert rollout.obs.dtype == np.uint8 and rollout.obs.shape == (32, 2, 2, 16, 16)
        assert rollout.obs.max() == 255  # the lit half, unscaled on the wire


@pytest.mark.parametrize(
    "mode, preset, sets",
    [
        (
            "sync",
            "cartpole-ppo",
            ["env.num_envs=2", "farm.num_tasks=2", "farm.steps_per_env=64", "ppo.num_minibatches=2"],
        ),
        ("async", "cartpole-dqn", ["dqn.learning_starts=256", "dqn.buffer_size=4096", "eval.interval=512"]),
    ],
)
def test_an_image_env_trains_a_cnn_in_both_modes(farm, tmp_path, mode, preset, sets):
    run_id = f"image-{mode}"
    args = [
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        preset,
        "--mode",
        mode,
        "--env",
        IMAGE_ENV,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "1024",
        "--set",
        "policy.cnn_features=32",
    ]
    for s in sets:
        args += ["--set", s]
    run = run_command(*args, env={**os.environ, **WORKER_ENV}, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    run_dir = tmp_path / run_id
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] >= 1024 and summary["final_version"] >= 1
    state, meta = codec.decode_policy((run_dir / "final_policy.safetensors").read_bytes())
    # The 16x16 image is too small for the Nature CNN's 8x8 kernels: the small 3x3 encoder, on 2 channels.
    assert tuple(state["encoder.convs.0.weight"].shape) == (16, 2, 3, 3)
    assert json.loads((run_dir / "config.json").read_text())["env"]["id"] == IMAGE_ENV
    # The saved CNN policy plays with `rlfarm eval`, as any policy does.
    played = run_command(
        "eval",
        "--policy",
        str(run_dir / "final_policy.safetensors"),
        "--env",
        IMAGE_ENV,
        "--episodes",
        "2",
        env={**os.environ, **WORKER_ENV},
        timeout=300,
    )
    assert played.returncode == 0 and "mean return" in played.stdout, played.stderr[-2000:]


@pytest.mark.process
def test_an_observation_space_rlfarm_cannot_act_on_fails_before_anything_starts(tmp_path):
    run = run_command(
        "train",
        "--env",
        "tests.tiny_envs:dict_obs",
        "--logdir",
        str(tmp_path),
        env={**os.environ, **WORKER_ENV},
        timeout=300,
    )
    assert run.returncode != 0
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rlfarm: error:") and "observation space Dict(" in lines[0]
    assert not list(tmp_path.iterdir())  # no run directory, no embedded farm started


@pytest.mark.learning
@pytest.mark.parametrize(
    "mode, preset",
    [
        pytest.param("sync", "cartpole-ppo", marks=pytest.mark.deterministic),
        ("async", "cartpole-ppo"),
        ("async", "cartpole-dqn"),
    ],
)
def test_the_cnn_path_learns_to_read_the_pixels(farm, tmp_path, mode, preset):
    """SideEnv pays 1 per step for naming the lit half of the image: a random policy scores 8 of 16,
    one that reads the pixels 16. PPO (SYNC), APPO (ASYNC) and DQN (ASYNC, judged by its greedy
    evaluation confirmed on 20 more episodes) must reach 15 within 40k env steps."""
    from .conftest import read_csv, read_summary

    run_id = f"read-pixels-{mode}-{preset}"
    args = [
        "train",
        "--redis",
        farm.redis_url,
        "--preset",
        preset,
        "--mode",
        mode,
        "--env",
        IMAGE_ENV,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "40000",
        "--seed",
        "1",
        "--target-return",
        "15",
        "--set",
        "policy.cnn_features=32",
    ]
    if preset == "cartpole-ppo":  # judged by the rolling training return: no evaluations on a schedule
        args += ["--set", "farm.steps_per_env=64", "--set", "ppo.learning_rate=1e-3", "--set", "eval.interval=0"]
    else:
        args += ["--set", "dqn.learning_starts=512", "--set", "eval.interval=1024"]
    run = run_command(*args, env={**os.environ, **WORKER_ENV}, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = read_summary(tmp_path / run_id)
    if preset == "cartpole-dqn":
        assert summary["target_reached_at"] is not None, summary
        assert summary["target_reached_at"]["env_steps"] <= 40000
    else:
        returns = np.array([float(e["episodic_return"]) for e in read_csv(tmp_path / run_id / "episodes.csv")])
        assert len(returns) >= 20
        best = np.convolve(returns, np.ones(20) / 20, mode="valid").max()
        print(f"{mode} {preset} on pixels: best rolling mean {best:.1f} in {summary['env_steps']} env steps")
        assert best >= 15

"""rlfarm from Python, as a notebook would use it: `rlfarm.train(...)` with a callback."""

from __future__ import annotations

import json

import pytest

import rlfarm
from rlfarm.errors import ConfigError

from .conftest import pid_alive, scalar_tags

pytestmark = pytest.mark.farm

SMALL = {"farm.num_tasks": 2, "env.num_envs": 1, "farm.steps_per_env": 512, "ppo.num_minibatches": 2}


def test_train_on_a_farm_with_a_callback_that_logs_and_stops(farm, tmp_path):
    seen: list[tuple[int, int]] = []

    def callback(step: rlfarm.LogStep) -> bool:
        seen.append((step.env_steps, step.version))
        assert "charts/SPS" in step.metrics and step.trainer.config.run_id == "api"
        step.extra["my/thousands_of_steps"] = step.env_steps / 1000
        return step.env_steps < 4096  # False stops the run

    result = rlfarm.train(
        "cartpole-ppo",
        overrides=SMALL,
        redis_url=farm.redis_url,
        run_id="api",
        logdir=str(tmp_path),
        total_steps=100_000,
        seed=3,
        callback=callback,
    )
    assert isinstance(result, rlfarm.TrainResult)
    assert result.env_steps == 4096 == seen[-1][0]  # stopped by the callback, not at total_steps
    assert [v for _, v in seen] == [1, 2, 3, 4]
    assert result.run_dir == tmp_path / "api" and result.final_policy == tmp_path / "api" / "final_policy.safetensors"
    # No evaluation came due (the preset's every 20,480 steps), but a run stopped by its callback
    # still evaluates its final policy: that is its best policy, with its scores.
    assert result.final_policy.exists() and result.best_policy == tmp_path / "api" / "best_policy.safetensors"
    assert result.best_policy.exists() and result.best_version == result.final_version == 4
    assert result.best_eval_mean_return == result.eval_mean_return > 0
    assert [row.split(",")[5] for row in (result.run_dir / "evals.csv").read_text().splitlines()[1:]] == ["4"]
    assert json.loads((result.run_dir / "config.json").read_text())["seed"] == 3
    assert scalar_tags(result.run_dir)["custom/my/thousands_of_steps"] == pytest.approx([1.024, 2.048, 3.072, 4.096])


def test_train_embedded_from_python_with_evaluations_and_a_best_policy(tmp_path):
    result = rlfarm.train(
        "cartpole-ppo",
        overrides={**SMALL, "eval.interval": 1024, "eval.episodes": 4},
        workers=1,
        run_id="api-embedded",
        logdir=str(tmp_path),
        total_steps=3072,
    )
    assert result.env_steps == 3072
    assert result.best_policy == tmp_path / "api-embedded" / "best_policy.safetensors"
    assert result.best_policy.exists() and result.best_version is not None
    # The run's best policy, as a script acts with it (SB3's model.predict).
    policy = rlfarm.load(result.best_policy)
    assert policy.version == str(result.best_version) and policy.env_id == "CartPole-v1"
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    action, state = policy.predict(obs, deterministic=True)
    assert state is None and env.action_space.contains(action)
    assert policy.predict([obs, obs])[0].shape == (2,)
    cluster = json.loads((result.run_dir / "cluster.json").read_text())
    assert not [pid for pid in cluster["pids"] if pid_alive(pid)]  # its Redis and workers are gone
    # torch_threads "auto": an MLP learns on one thread, whatever the machine.
    assert json.loads((result.run_dir / "summary.json").read_text())["trainer_threads"] == 1


def test_bad_input_is_an_exception_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'ppo.gama'"):
        rlfarm.train("cartpole-ppo", overrides={"ppo.gama": 0.9}, logdir=str(tmp_path))
    with pytest.raises(ConfigError, match="cannot run in --mode sync"):
        rlfarm.train("cartpole-dqn", mode="sync", logdir=str(tmp_path))
    assert not any(tmp_path.iterdir())

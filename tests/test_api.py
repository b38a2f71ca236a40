"""rlfarm from Python, as a notebook would use it: `rlfarm.train(...)` with a callback."""

from __future__ import annotations

import json

import pytest

import rlfarm
from rlfarm.config import ConfigError

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

    result = rlfarm.train("cartpole-ppo", overrides=SMALL, redis_url=farm.redis_url, run_id="api",
                          logdir=str(tmp_path), total_steps=100_000, seed=3, callback=callback)
    assert isinstance(result, rlfarm.TrainResult)
    assert result.env_steps == 4096 == seen[-1][0]  # stopped by the callback, not at total_steps
    assert [v for _, v in seen] == [1, 2, 3, 4]
    assert result.run_dir == tmp_path / "api" and result.final_policy == tmp_path / "api" / "final_policy.safetensors"
    assert result.final_policy.exists() and result.best_policy is None  # no evaluations in this run
    assert json.loads((result.run_dir / "config.json").read_text())["seed"] == 3
    assert scalar_tags(result.run_dir)["custom/my/thousands_of_steps"] == pytest.approx([1.024, 2.048, 3.072, 4.096])


def test_train_embedded_from_python_with_evaluations_and_a_best_policy(tmp_path):
    result = rlfarm.train("cartpole-ppo", overrides={**SMALL, "eval.interval": 1024, "eval.episodes": 4},
                          workers=1, run_id="api-embedded", logdir=str(tmp_path), total_steps=3072)
    assert result.env_steps == 3072
    assert result.best_policy == tmp_path / "api-embedded" / "best_policy.safetensors"
    assert result.best_policy.exists() and result.best_version is not None
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


def test_one_lucky_evaluation_does_not_end_a_run_and_the_best_policy_is_kept(redis_only, tmp_path):
    """The evaluation rule on a real Redis, with evaluation results handed in directly: an evaluation
    at the target starts a confirmation of the same (pinned) version; only an agreeing confirmation
    ends the run, and the best version by all its episodes is written to best_policy.safetensors."""
    from rlfarm.core import codec
    from rlfarm.config import to_dict
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.core.protocol import Result
    from rlfarm.trainer import make_trainer

    from rlfarm.api import make_config

    cfg = make_config("cartpole-dqn", run_id="lucky", logdir=str(tmp_path), target_return=475.0,
                      overrides={"farm.keep_versions": 2})
    trainer = make_trainer(cfg, redis_only.redis_url, tmp_path / "lucky")
    trainer.logger = RunLogger(tmp_path / "lucky", to_dict(cfg), cfg.total_steps, tensorboard=False)
    trainer.publish()

    def finish(evaluation: int, returns: list[float]) -> None:
        half = len(returns) // 2
        for index, part in enumerate((returns[:half], returns[half:])):
            trainer.handle_eval(Result("eval", evaluation, index, version=trainer.version, returns=part))

    trainer.evaluate()  # evaluation 0 of v0
    finish(0, [500.0] * 10)  # lucky: at the target...
    assert not trainer.target_reached()  # ...but not enough on its own
    assert trainer._evals[1].confirm and trainer._evals[1].version == 0  # a confirmation of v0 is out
    for _ in range(3):  # newer versions meanwhile: v0 stays retrievable (pinned), keep_versions 2
        trainer.version += 1
        trainer.publish()
    assert 0 in trainer.store.versions()
    finish(1, [100.0] * 20)  # the confirmation disagrees
    assert not trainer.target_reached()
    assert trainer.best_version == 0 and trainer.best_eval_mean_return == pytest.approx((5000 + 2000) / 30)
    _, meta = codec.decode_policy((tmp_path / "lucky" / "best_policy.safetensors").read_bytes())
    assert meta["version"] == "0" and float(meta["eval_mean_return"]) == pytest.approx(233.333, abs=1e-3)

    trainer.evaluate()  # evaluation 2, of v3
    finish(2, [490.0] * 10)
    finish(3, [480.0] * 20)  # confirmed: now the run may stop, and v3 is the best
    assert trainer.target_reached() and trainer.best_version == 3
    assert 0 not in trainer.store.versions()  # v0 unpinned and trimmed
    trainer.logger.close()

"""A sweep's study is data, not authority: trials appended to it from outside (Optuna's own API against
the farm's real Redis, by a process without RLFARM_SECRET) never train and never become best.toml.

What an audit did: `study.add_trial(create_trial(params={"env.id": "tempfile:mkdtemp"}, value=1e9))`
from another process made best.toml carry that env id, and `rlfarm train --preset best.toml` then
called tempfile.mkdtemp(); `env.num_envs = 100000` and a learning rate of 1e6 went through as well.
"""

from __future__ import annotations

import pytest

from rlfarm import config as C
from rlfarm.config.space import parse_space

from .conftest import read_csv, run_cli

BASE = C.load_preset("cartpole-ppo")
SPACE_TOML = (
    '[space]\n"ppo.learning_rate" = { low = 1e-4, high = 1e-2, log = true }\n"env.num_envs" = { low = 2, high = 8 }\n'
)
SPACE = parse_space(
    {"space": {"ppo.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}, "env.num_envs": {"low": 2, "high": 8}}},
    BASE,
)
SECRET = b"the sweep's secret"


def optuna():
    module = pytest.importorskip("optuna", reason="rlfarm sweep needs Optuna: pip install 'rlfarm[sweep]'")
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def sweep_study(redis_url: str, name: str, legit: list[tuple[float, int, float]], secret: bytes | None = None):
    """A study in the farm's Redis with trials told as `rlfarm sweep` tells them: (learning rate,
    num_envs, value), sampled through the space and, with a secret, signed as the sweep signs them."""
    from rlfarm.config.space import sample
    from rlfarm.core.signing import trial_signature
    from rlfarm.tune.study import make_pruner, open_study

    study = open_study(redis_url, name, False, make_pruner("none", 0, 1), seed=1)
    for lr, envs, value in legit:
        study.enqueue_trial({"ppo.learning_rate": lr, "env.num_envs": envs})
        trial = study.ask()
        params = sample(SPACE, trial)
        if secret is not None:
            trial.set_user_attr("signature", trial_signature(name, trial.number, params, secret))
        study.tell(trial, value)
    return study


def forge(redis_url: str, name: str, params: dict, value: float = 1e9, user_attrs: dict | None = None) -> None:
    """What the audit did, from a storage of its own (another process's view of the same Redis)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from rlfarm.tune.study import storage

    module = optuna()
    kinds = {
        str: lambda v: CategoricalDistribution([v]),
        int: lambda v: IntDistribution(0, max(v, 1)),
        float: lambda v: FloatDistribution(0.0, max(v, 1.0)),
    }
    study = module.load_study(study_name=name, storage=storage(redis_url))
    study.add_trial(
        module.trial.create_trial(
            params=params,
            value=value,
            user_attrs=user_attrs or {},
            distributions={k: kinds[type(v)](v) for k, v in params.items()},
        )
    )


def reread(redis_url: str, name: str):
    from rlfarm.tune.study import storage

    return optuna().load_study(study_name=name, storage=storage(redis_url))


def test_write_best_skips_appended_trials_outside_the_space_and_writes_the_legit_best(redis_only, tmp_path):
    from rlfarm.tune.report import write_best, write_trials_csv

    name = "forged-space"
    sweep_study(redis_only.redis_url, name, [(3e-3, 4, 100.0), (1e-3, 2, 300.0), (5e-3, 8, 200.0)])
    forge(redis_only.redis_url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 4, "env.id": "tempfile:mkdtemp"})
    forge(redis_only.redis_url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 100000})
    forge(redis_only.redis_url, name, {"ppo.learning_rate": 1e6, "env.num_envs": 4})
    forge(redis_only.redis_url, name, {"ppo.learning_rate": 3e-3})  # a key of the space missing
    study = reread(redis_only.redis_url, name)
    assert study.best_trial.value == 1e9  # what Optuna itself would call best

    best, skipped = write_best(study, BASE, "eval", tmp_path / "best.toml", SPACE)
    assert (best.number, best.value) == (1, 300.0)
    assert [(t.number, why) for t, why in skipped] == [
        (3, 'env.id = "tempfile:mkdtemp" is not in the space (no such key in it)'),
        (4, "env.num_envs = 100000 is not in the space (int in [2, 8])"),
        (5, "ppo.learning_rate = 1000000.0 is not in the space (float in [0.0001, 0.01] log)"),
        (6, "env.num_envs has no value, but it is in the space"),
    ]
    text = (tmp_path / "best.toml").read_text()
    assert "tempfile" not in text and "1e9" not in text and "1000000000" not in text
    cfg = C.build(str(tmp_path / "best.toml"))
    assert (cfg.ppo.learning_rate, cfg.env.num_envs, cfg.env.id) == (1e-3, 2, "CartPole-v1")

    rows = read_csv(write_trials_csv(study, tmp_path / "trials.csv", SPACE))
    assert [r["refused"] for r in rows[:3]] == ["", "", ""]
    assert rows[3]["refused"].startswith('env.id = "tempfile:mkdtemp" is not in the space')


def test_with_a_secret_an_unsigned_trial_inside_the_space_is_never_best(redis_only, tmp_path):
    """Within the space a forged trial would pass; with RLFARM_SECRET it needs this sweep's signature
    over (study, number, params): none, one copied from another trial, or one made with another
    secret are all left out. Trials signed with the secret (another machine's, `--resume`) count."""
    from rlfarm.core.signing import trial_signature
    from rlfarm.tune.report import write_best, write_trials_csv

    name = "forged-signed"
    url = redis_only.redis_url
    sweep_study(url, name, [(3e-3, 4, 100.0), (1e-3, 2, 150.0)], secret=SECRET)
    copied = reread(url, name).trials[0].user_attrs["signature"]
    forge(url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 4})
    forge(url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 4}, user_attrs={"signature": copied})
    params = {"ppo.learning_rate": 2e-3, "env.num_envs": 6}
    forge(url, name, params, user_attrs={"signature": trial_signature(name, 4, params, b"another secret")})
    forge(url, name, params, value=120.0, user_attrs={"signature": trial_signature(name, 5, params, SECRET)})

    study = reread(url, name)
    best, skipped = write_best(study, BASE, "eval", tmp_path / "best.toml", SPACE, SECRET)
    assert (best.number, best.value) == (1, 150.0)
    assert [(t.number, why) for t, why in skipped] == [
        (
            2,
            f"trial 2 of sweep {name!r} is not signed, but this farm signs its data "
            f"(RLFARM_SECRET, or the secret the embedded farm made): refusing it",
        ),
        (
            3,
            f"trial 3 of sweep {name!r} has a bad signature (forged, or signed with another RLFARM_SECRET): "
            f"refusing it",
        ),
        (
            4,
            f"trial 4 of sweep {name!r} has a bad signature (forged, or signed with another RLFARM_SECRET): "
            f"refusing it",
        ),
    ]
    assert C.build(str(tmp_path / "best.toml")).ppo.learning_rate == 1e-3
    rows = read_csv(write_trials_csv(study, tmp_path / "trials.csv", SPACE, SECRET))
    assert [bool(r["refused"]) for r in rows] == [False, False, True, True, True, False]
    # without the secret the space is the only guard: the unsigned forgeries within it then count
    best, skipped = write_best(study, BASE, "eval", tmp_path / "unsigned.toml", SPACE)
    assert best.value == 1e9 and skipped == []


def test_the_sweep_refuses_to_train_an_enqueued_trial_outside_the_space(redis_only, tmp_path):
    """Optuna hands an enqueued trial's values to suggest_* as they are, out of range or not; the sweep
    holds them against its space and tells the trial FAILED with the reason, starting no trainer."""
    from rlfarm.tune.report import trial_line
    from rlfarm.tune.study import make_pruner, open_study
    from rlfarm.tune.sweep import Sweep, SweepPlan

    name = "forged-enqueued"
    space = parse_space(
        {
            "space": {
                "ppo.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
                "env.num_envs": {"low": 2, "high": 8},
                "env.id": {"choices": ["CartPole-v1", "Acrobot-v1"]},
            }
        },
        BASE,
    )
    study = open_study(redis_only.redis_url, name, False, make_pruner("none", 0, 1), seed=1)
    forger = reread(redis_only.redis_url, name)
    forger.enqueue_trial({"ppo.learning_rate": 3e-3, "env.num_envs": 100000, "env.id": "CartPole-v1"})
    forger.enqueue_trial({"ppo.learning_rate": 1e6, "env.num_envs": 4, "env.id": "CartPole-v1"})
    forger.enqueue_trial({"ppo.learning_rate": 3e-3, "env.num_envs": 4, "env.id": "tempfile:mkdtemp"})
    lines = []
    plan = SweepPlan(trials=3, parallel=1, metric="return")
    sweep = Sweep(study, space, [], plan, tmp_path, {}, on_end=lambda run: lines.append(trial_line(run)))
    runs = sweep.run()
    assert [(r.state, r.trainer) for r in runs] == [("REFUSED", None)] * 3
    assert lines[:2] == [
        "trial 0 REFUSED, not trained: env.num_envs = 100000 is not in the space (int in [2, 8])",
        "trial 1 REFUSED, not trained: ppo.learning_rate = 1000000.0 is not in the space (float in [0.0001, 0.01] log)",
    ]
    assert (
        lines[2].startswith("trial 2 REFUSED, not trained: env.id: ")
        and "'tempfile:mkdtemp'" in lines[2]
        and lines[2].endswith("(not in the space: one of ['CartPole-v1', 'Acrobot-v1'])")
    )
    trials = reread(redis_only.redis_url, name).trials
    assert [t.state.name for t in trials] == ["FAIL"] * 3
    assert (
        trials[0].user_attrs["fail_reason"]
        == "refused, not trained: env.num_envs = 100000 is not in the space (int in [2, 8])"
    )
    assert not (tmp_path / "logs").exists()  # no trainer was started


def test_the_sweep_command_prints_one_line_per_refused_and_left_out_trial(redis_only, tmp_path):
    """End to end through `rlfarm sweep --resume` on the farm's Redis: the enqueued trials outside the
    space are REFUSED (no trainer runs), the appended COMPLETE ones are left out of best.toml, each in
    one line, and best.toml is the legit trial's."""
    name = "forged-cli"
    url = redis_only.redis_url
    sweep_study(url, name, [(3e-3, 4, 100.0)])
    forge(url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 4, "env.id": "tempfile:mkdtemp"})
    forge(url, name, {"ppo.learning_rate": 3e-3, "env.num_envs": 100000})
    forger = reread(url, name)
    forger.enqueue_trial({"ppo.learning_rate": 1e6, "env.num_envs": 4})
    forger.enqueue_trial({"ppo.learning_rate": 3e-3, "env.num_envs": 100000})
    (tmp_path / "space.toml").write_text(SPACE_TOML)
    result = run_cli(
        "sweep",
        "--resume",
        name,
        "--redis",
        url,
        "--space",
        str(tmp_path / "space.toml"),
        "--trials",
        "2",
        "--parallel",
        "1",
        "--pruner",
        "none",
        "--logdir",
        str(tmp_path),
        env={"RLFARM_SECRET": ""},
    )
    assert result.returncode == 1, result.stderr[-3000:]
    out = result.stdout.splitlines()
    assert (
        "trial 3 REFUSED, not trained: ppo.learning_rate = 1000000.0 is not in the space (float in "
        "[0.0001, 0.01] log)" in out
    )
    assert "trial 4 REFUSED, not trained: env.num_envs = 100000 is not in the space (int in [2, 8])" in out
    warnings = [line for line in result.stderr.splitlines() if "left out of best.toml" in line]
    assert warnings == [
        'rlfarm: warning: trial 1 left out of best.toml: env.id = "tempfile:mkdtemp" is not in the space '
        "(no such key in it)",
        "rlfarm: warning: trial 2 left out of best.toml: env.num_envs = 100000 is not in the space (int in [2, 8])",
    ]
    assert result.stderr.splitlines()[-1] == (
        "rlfarm: error: trials 3, 4 refused: params not in the space (reasons in trials.csv); the others ran"
    )
    best = tmp_path / name / "best.toml"
    assert "tempfile" not in best.read_text() and "trial 0" in best.read_text()
    assert C.build(str(best)).env.num_envs == 4
    assert not (tmp_path / name / "logs").exists()  # nothing was trained
    rows = {int(r["number"]): r for r in read_csv(tmp_path / name / "trials.csv")}
    assert [rows[n]["state"] for n in range(5)] == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL", "FAIL"]
    assert rows[3]["fail_reason"].startswith("refused, not trained: ppo.learning_rate = 1000000.0")


def test_a_preset_file_with_a_bad_value_or_a_callable_that_is_no_env_is_one_line(tmp_path, monkeypatch):
    """best.toml is read by `rlfarm train --preset` through the normal config path: a value the config
    refuses is the usual one-line error, and an env id naming a callable that makes no env (the
    audit's tempfile:mkdtemp) is one line instead of a traceback."""
    import tempfile

    from click.testing import CliRunner

    from cli import main

    monkeypatch.setattr(
        tempfile, "tempdir", str(tmp_path)
    )  # mkdtemp, called as the env's constructor, makes its dir here

    def error(text):
        (tmp_path / "best.toml").write_text(text)
        result = CliRunner().invoke(main, ["train", "--preset", str(tmp_path / "best.toml")])
        assert result.exit_code == 2, result.output
        [line] = result.output.strip().splitlines()
        return line

    assert error("[env]\nnum_envs = 0\n") == "rlfarm: error: env.num_envs must be at least 1, got 0"
    assert (
        error('[env]\nid = "tempfile:mkdtemp"\n')
        == "rlfarm: error: env 'tempfile:mkdtemp': its constructor returned str, not a gymnasium Env"
    )

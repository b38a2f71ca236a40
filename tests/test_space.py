"""Unit: a sweep's search space (parsing, checks against the config, a trial's overrides), best.toml's
TOML, the --seeds parser and what a seed's trainer is passed."""

from __future__ import annotations

import tomllib

import click
import pytest
from click.testing import CliRunner

from rlfarm import config as C
from rlfarm.config.dump import preset_toml, toml_value
from rlfarm.config.seeds import parse_seeds
from rlfarm.config.space import check_params, load_space, parse_space, sample, to_overrides

BASE = C.load_preset("cartpole-ppo")


def space(**entries):
    return parse_space({"space": entries}, BASE)


def test_the_documented_space_parses_into_its_three_kinds(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text(
        '[space]\n"ppo.learning_rate" = { low = 1e-4, high = 1e-2, log = true }\n'
        '"ppo.update_epochs" = { choices = [4, 10] }\n"ppo.clip_coef" = { low = 0.1, high = 0.3 }\n'
        '"farm.num_tasks" = { low = 2, high = 8, step = 2 }\n'
    )
    lr, epochs, clip, tasks = load_space(path, BASE)
    assert (lr.key, lr.log, lr.is_int) == ("ppo.learning_rate", True, False)
    assert epochs.choices == (4, 10) and not epochs.is_int
    assert not clip.is_int and clip.low == 0.1
    assert tasks.is_int and tasks.step == 2


class FixedTrial:
    """What an optuna Trial's suggest_* are asked: records the calls, answers the low end or first choice."""

    def __init__(self):
        self.calls = []

    def suggest_float(self, name, low, high, step=None, log=False):
        self.calls.append(("float", name, low, high, step, log))
        return low

    def suggest_int(self, name, low, high, step=1, log=False):
        self.calls.append(("int", name, low, high, step, log))
        return low

    def suggest_categorical(self, name, choices):
        self.calls.append(("categorical", name, choices))
        return choices[-1]


def test_a_trial_becomes_set_overrides_that_build_the_same_config():
    params = space(
        **{
            "ppo.learning_rate": {"low": 1e-5, "high": 1e-2, "log": True},
            "ppo.update_epochs": {"choices": [4, 10]},
            "farm.num_tasks": {"low": 2, "high": 8, "step": 2},
            "ppo.clip_vloss": {"choices": [False, True]},
        }
    )
    trial = FixedTrial()
    values = sample(params, trial)
    assert trial.calls == [
        ("float", "ppo.learning_rate", 1e-5, 1e-2, None, True),
        ("categorical", "ppo.update_epochs", [4, 10]),
        ("int", "farm.num_tasks", 2, 8, 2, False),
        ("categorical", "ppo.clip_vloss", [False, True]),
    ]
    overrides = to_overrides(values)
    assert overrides == ["ppo.learning_rate=1e-05", "ppo.update_epochs=10", "farm.num_tasks=2", "ppo.clip_vloss=true"]
    cfg = C.build("cartpole-ppo", overrides)
    assert (cfg.ppo.learning_rate, cfg.ppo.update_epochs, cfg.farm.num_tasks, cfg.ppo.clip_vloss) == (1e-5, 10, 2, True)


@pytest.mark.parametrize(
    "entries, message",
    [
        (
            {"ppo.learnig_rate": {"low": 1e-4, "high": 1e-2}},
            "unknown config key 'ppo.learnig_rate' (did you mean ppo.learning_rate?)",
        ),
        ({"ppo.learning_rate": {"low": 1e-2, "high": 1e-4}}, "bad range: low (0.01) must be below high (0.0001)"),
        ({"ppo.learning_rate": {"low": 0, "high": 1e-2, "log": True}}, "a log range needs low > 0"),
        ({"ppo.learning_rate": {"low": 1e-4}}, "a range needs both low and high"),
        ({"ppo.update_epochs": {"choices": []}}, "choices must be a non-empty list"),
        ({"ppo.update_epochs": {"choices": [4], "low": 1, "high": 3}}, "either choices or low/high"),
        ({"ppo.update_epochs": {"low": 0, "high": 4}}, "ppo.update_epochs must be at least 1"),
        ({"ppo.update_epochs": {"low": 1.5, "high": 4.0}}, "ppo.update_epochs: expected an integer, got 1.5"),
        ({"ppo.update_epochs": {"low": 1, "high": 4, "step": 0.5}}, "needs an int step"),
        ({"ppo.clip_coef": {"low": 0.1, "high": 0.3, "sigma": 1}}, "unknown field 'sigma'"),
        ({"ppo.clip_coef": 0.2}, "expected a table"),
    ],
)
def test_bad_spaces_are_one_clear_error_naming_the_key(entries, message):
    with pytest.raises(C.ConfigError) as exc:
        space(**entries)
    assert message in str(exc.value)
    assert str(exc.value).startswith(f"space key {next(iter(entries))!r}: ")


def test_env_id_is_searched_only_by_choices():
    """A string key has no range: env.id with low/high is one error; its choices are the only ids a
    trial may carry (check_params), a module id too if the user listed it."""
    with pytest.raises(C.ConfigError) as exc:
        space(**{"env.id": {"low": 1, "high": 2}})
    assert str(exc.value) == "space key 'env.id': env.id: expected a string, got 1"
    [env] = space(**{"env.id": {"choices": ["CartPole-v1", "tests.tiny_envs:slow"]}})
    assert env.contains("tests.tiny_envs:slow") and not env.contains("tempfile:mkdtemp")


def test_a_param_contains_only_the_points_of_its_dimension():
    lr, epochs, tasks, clip, vloss, coef = space(
        **{
            "ppo.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
            "ppo.update_epochs": {"choices": [4, 10]},
            "farm.num_tasks": {"low": 2, "high": 8, "step": 2},
            "ppo.clip_coef": {"low": 0.1, "high": 0.3, "step": 0.05},
            "ppo.clip_vloss": {"choices": [False, True]},
            "ppo.ent_coef": {"low": 0, "high": 0.5},
        }
    )
    assert lr.contains(1e-4) and lr.contains(1e-2) and lr.contains(3e-3)
    assert not any(lr.contains(v) for v in (1e6, 0.0, -1e-3, float("nan"), float("inf"), "0.001", True, None))
    assert epochs.contains(4) and epochs.contains(10.0)  # TOML may give 10 back as 10.0: the same number
    assert not any(epochs.contains(v) for v in (5, "4", True, [4]))
    assert tasks.contains(2) and tasks.contains(8) and tasks.contains(6)
    assert not any(tasks.contains(v) for v in (3, 10, 0, 4.0, 100000, True))  # an int range takes ints
    assert clip.contains(0.1) and clip.contains(0.15000000000000002) and clip.contains(0.3)
    assert not clip.contains(0.12) and not clip.contains(0.35)
    assert vloss.contains(True) and vloss.contains(False) and not vloss.contains(1) and not vloss.contains(0)
    assert coef.contains(0) and coef.contains(0.25) and not coef.contains(0.6)


def test_optuna_samples_only_points_check_params_accepts():
    """Whatever Optuna's sampler draws from a space is a point of it (float steps included), so a
    sweep never refuses its own trial."""
    optuna = pytest.importorskip("optuna")
    params = space(
        **{
            "ppo.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
            "ppo.clip_coef": {"low": 0.1, "high": 0.3, "step": 0.05},
            "farm.num_tasks": {"low": 2, "high": 9, "step": 3},
            "ppo.vf_coef": {"low": 0.1, "high": 0.9, "step": 0.1},
            "ppo.update_epochs": {"choices": [4, 10]},
        }
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(300):
        trial = study.ask()
        values = sample(params, trial)
        assert check_params(values, params) is None and check_params(trial.params, params) is None, values
        study.tell(trial, 0.0)


def test_check_params_names_the_first_key_and_value_not_in_the_space():
    params = space(
        **{"ppo.learning_rate": {"low": 1e-4, "high": 1e-2, "log": True}, "env.num_envs": {"low": 1, "high": 8}}
    )
    ok = {"ppo.learning_rate": 1e-3, "env.num_envs": 4}
    assert check_params(ok, params) is None
    assert (
        check_params({**ok, "env.num_envs": 100000}, params)
        == "env.num_envs = 100000 is not in the space (int in [1, 8])"
    )
    assert (
        check_params({**ok, "ppo.learning_rate": 1e6}, params)
        == "ppo.learning_rate = 1000000.0 is not in the space (float in [0.0001, 0.01] log)"
    )
    assert (
        check_params({**ok, "env.id": "tempfile:mkdtemp"}, params)
        == 'env.id = "tempfile:mkdtemp" is not in the space (no such key in it)'
    )
    assert check_params({"ppo.learning_rate": 1e-3}, params) == "env.num_envs has no value, but it is in the space"
    long = check_params({**ok, "env.num_envs": "x" * 10_000}, params)  # a forged value of any length: one short line
    assert len(long) < 200 and "\n" not in long and long.endswith("is not in the space (int in [1, 8])")
    assert "\n" not in check_params({**ok, "a\nb": 1}, params)


def test_a_space_file_missing_empty_or_not_toml_is_one_error(tmp_path):
    with pytest.raises(C.ConfigError, match="no space file"):
        load_space(tmp_path / "nope.toml", BASE)
    (tmp_path / "empty.toml").write_text("")
    with pytest.raises(C.ConfigError, match=r"non-empty \[space\] table"):
        load_space(tmp_path / "empty.toml", BASE)
    (tmp_path / "bad.toml").write_text("[space\n")
    with pytest.raises(C.ConfigError, match="invalid TOML"):
        load_space(tmp_path / "bad.toml", BASE)


def test_a_preset_written_back_reads_as_the_same_config(tmp_path):
    flat = {
        **BASE,
        "ppo.learning_rate": 1.2345e-4,
        "ppo.update_epochs": 10,
        "description": 'a "quoted" one',
        "policy.hidden_sizes": (32, 32),
        "ppo.clip_vloss": True,
        "total_steps": 4096,
    }
    path = tmp_path / "best.toml"
    path.write_text(preset_toml(flat, "header line\nsecond"))
    assert path.read_text().startswith("# header line\n# second\n")
    assert C.build(str(path)) == C.from_flat(flat)
    assert [tomllib.loads(f"v = {toml_value(v)}")["v"] for v in (1e-05, 3.0, 7, "x\\y")] == [1e-05, 3.0, 7, "x\\y"]


@pytest.mark.parametrize(
    "text, seeds", [("1-5", [1, 2, 3, 4, 5]), ("1,2,3", [1, 2, 3]), ("3,1-2,3", [3, 1, 2]), (" 0 , 7 ", [0, 7])]
)
def test_seeds_parse(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    "text, message",
    [
        ("5-1", "runs backwards"),
        ("a,b", "expected non-negative seeds"),
        ("1,-2", "expected non-negative seeds"),
        ("", "expected"),
        ("4", "at least two seeds"),
        ("1-2-3", "expected"),
    ],
)
def test_bad_seeds_are_refused(text, message):
    with pytest.raises(C.ConfigError, match=message):
        parse_seeds(text)


def test_bad_seeds_on_the_command_line_are_one_usage_line():
    from cli import main

    result = CliRunner().invoke(main, ["train", "--seeds", "5-1"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "rlfarm: error: invalid value for '--seeds': the range 5-1 runs backwards (write 1-5) (see main train --help)"
    ]


def test_a_seed_trainer_gets_the_options_given_and_any_new_one_like_share():
    """Every option the user typed reaches each seed's `rlfarm train`, except the ones --seeds makes
    itself (--share and any option `train` gains later included, with no list kept here)."""
    from rlfarm.cli.seeds import SEEDS_OWN, passed_through
    from rlfarm.cli.train import train

    command = click.Command("train", params=[*train.params, click.Option(["--later"], type=float)])
    ctx = command.make_context(
        "train",
        [
            "--preset",
            "cartpole-ppo",
            "--set",
            "a=1",
            "--set",
            "b=2",
            "--seeds",
            "1-3",
            "--run-id",
            "x",
            "--share",
            "0.5",
            "--total-steps",
            "64",
            "--mode",
            "sync",
            "--later",
            "2",
        ],
    )
    assert passed_through(ctx, SEEDS_OWN) == [
        "--preset",
        "cartpole-ppo",
        "--mode",
        "sync",
        "--set",
        "a=1",
        "--set",
        "b=2",
        "--share",
        "0.5",
        "--total-steps",
        "64",
        "--later",
        "2.0",
    ]

"""rlfarm.config: presets, overrides, validation, the declared RunConfig."""

import ast
import dataclasses
import typing

import pytest

from rlfarm import algos
from rlfarm import config as C

from .conftest import ROOT


def test_presets_load_and_validate():
    names = C.preset_names()
    assert {"cartpole-ppo", "pendulum-ppo"} <= set(names)
    for name in names:
        cfg = C.build(name)
        assert cfg.total_steps > 0 and C.preset_description(name)


def test_overrides_and_types():
    cfg = C.build(
        "cartpole-ppo",
        [
            "ppo.learning_rate=0.01",
            "policy.hidden_sizes=[32, 32]",
            "seed=3",
            "env.id=Acrobot-v1",
            "ppo.anneal_lr=false",
        ],
    )
    assert cfg.ppo.learning_rate == 0.01 and cfg.policy.hidden_sizes == (32, 32)
    assert cfg.seed == 3 and cfg.env.id == "Acrobot-v1" and cfg.ppo.anneal_lr is False
    assert C.build("cartpole-ppo", ["ppo.learning_rate=1"]).ppo.learning_rate == 1.0


def test_every_algorithm_package_is_a_typed_field_of_run_config():
    """RunConfig declares a field per algorithm, named as it and typed with its section (so `cfg.ppo`
    is typed); the registry reads those fields, and a package left out of them is caught here."""
    packages = sorted(p.parent.name for p in (ROOT / "rlfarm" / "algos").glob("*/config.py"))
    hints = typing.get_type_hints(C.RunConfig)
    assert list(C.ALGORITHMS) == packages == algos.names()
    for name, section in C.ALGORITHMS.items():
        assert hints[name] is section and section.algo == name and dataclasses.is_dataclass(section)
        assert section.__module__ == f"rlfarm.algos.{name}.config" and algos.section(name) is section
        assert set(section.learners) == set(section.modes)
    assert type(C.RunConfig().ppo).__name__ == "PPOConfig" and C.build(None, ["ppo.clip_coef=0.1"]).ppo.clip_coef == 0.1


def test_the_config_layer_finds_no_module_by_scanning():
    """Every module rlfarm.config uses is named by an import statement: no package is scanned and no
    module imported by a computed name."""
    scanning = {"import_module", "find_spec", "iter_modules", "walk_packages", "__import__"}
    for path in (ROOT / "rlfarm" / "config").glob("*.py"):
        used = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.ImportFrom):
                used |= {alias.name for alias in node.names}
        assert not used & scanning, (path.name, used & scanning)


@pytest.mark.parametrize(
    "key, says, never",
    [
        # The likely key alone: every ~150 keys after it was a screenful (issue 51).
        ("ppo.learnin_rate", "unknown config key 'ppo.learnin_rate' (did you mean ppo.learning_rate?)", "farm."),
        ("ppo.zzz", "the keys of [ppo]: ppo.adam_eps, ", "farm."),  # no close match: its section's keys
        ("zzz.yyy", "with sections async, dqn, env, eval, farm, policy, ppo,", "ppo.gamma"),  # no such section
    ],
)
def test_an_unknown_key_says_what_it_likely_is_not_every_key(key, says, never):
    with pytest.raises(C.ConfigError) as err:
        C.build("cartpole-ppo", [f"{key}=1"])
    msg = str(err.value)
    assert says in msg and never not in msg and len(msg) < 600, msg


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("seed=abc", "expected an integer"),
        ("ppo.anneal_lr=1", "expected true or false"),
        ("ppo.gamma=fast", "expected a number"),
        ("mode=fast", "mode must be one of"),
        ("farm.num_tasks=0", "at least 1"),
        ("ppo.num_minibatches=7", "must divide"),
        ("novalue", "key=value"),
        ("torch_threads=-1", "or 0"),
        ("farm.workers=-2", "or 0"),
        ("seed=auto", "expected an integer"),  # "auto" only where 0 means chosen for you
    ],
)
def test_bad_values_are_clear(override, fragment):
    with pytest.raises(C.ConfigError, match=fragment):
        C.build("cartpole-ppo", [override])


def test_unknown_preset_and_dict_roundtrip():
    with pytest.raises(C.ConfigError, match="unknown preset 'cartpole-pp'.*cartpole-ppo"):
        C.build("cartpole-pp")
    cfg = C.build("pendulum-ppo")
    assert C.from_dict(C.to_dict(cfg)) == cfg


def test_auto_threads_and_workers_split_the_cores():
    """torch_threads and farm.workers "auto" (0): MLPs learn on one thread; a CNN run's cores are split
    by what an env step costs each side (ppo: a forward-backward per epoch, one more forward for
    V-trace's targets unless APPO learns in one pass; a worker: ACTING_FORWARDS); explicit values win."""
    cfg = C.build("pong", ["torch_threads=auto", "farm.workers=auto"])
    assert cfg.torch_threads == 0 and cfg.farm.workers == 0
    assert C.acting_share(cfg) == pytest.approx(1.4 / (1.4 + 3 * 4))  # the preset's 4 SYNC epochs
    # SYNC: a group is acted, then learned from: a worker per task (2) while they act, every core to learn
    assert [C.local_workers(cfg, cores) for cores in (1, 2, 3, 16)] == [1, 2, 2, 2]
    assert C.trainer_threads(cfg, image=True, local=2, cores=2) == 2
    assert C.trainer_threads(cfg, image=True, local=2, cores=16) == 16
    assert C.trainer_threads(cfg, image=True, local=0, cores=16) == 16  # a remote farm: every core
    assert C.trainer_threads(cfg, image=True, local=4, cores=1) == 1  # never below one
    assert C.trainer_threads(cfg, image=False, local=0, cores=16) == 1
    one_pass = C.build("pong", ["mode=async", "ppo.update_epochs=1", "ppo.num_minibatches=8"])  # a quarter
    assert [C.local_workers(one_pass, cores) for cores in (2, 16)] == [1, 5]
    assert C.trainer_threads(one_pass, image=True, local=1, cores=2) == 1
    assert C.trainer_threads(one_pass, image=True, local=5, cores=16) == 11
    two_pass = C.build("pong", ["mode=async", "ppo.update_epochs=2"])  # V-trace's targets: one more forward
    assert C.acting_share(two_pass) == pytest.approx(1.4 / (1.4 + 3 * 2 + 1))
    async_pong = C.build("pong", ["mode=async"])  # acting beside the 4-epoch learner: its share of the cores
    assert [C.local_workers(async_pong, cores) for cores in (2, 16)] == [1, 2]
    assert C.trainer_threads(async_pong, image=True, local=1, cores=2) == 2  # the worker waits for the learner
    assert C.trainer_threads(async_pong, image=True, local=2, cores=16) == 14
    fixed = C.build("pong", ["torch_threads=3", "farm.workers=5"])
    assert C.trainer_threads(fixed, image=True, local=5, cores=2) == 3 and C.local_workers(fixed, 2) == 5
    assert C.local_workers(C.build("cartpole-ppo"), 16) == 2  # presets that name a count keep it
    assert C.local_workers(C.build("cartpole-dqn", ["farm.workers=auto"]), 16) == 8  # no cost model: half
    assert 1 <= C.machine_cores()


@pytest.mark.parametrize(
    "toml",
    [
        'algo = "ppo"\n[' + ".".join(["t"] * 5000) + "]\nx = 1\n",  # 5,000 tables deep
        'algo = "ppo"\nseed = ' + "[" * 3000 + "]" * 3000 + "\n",  # an array 3,000 deep
        'algo = "ppo"\nseed = ' + "[" * 17 + "]" * 17 + "\n",  # past the bound, within Python's stack
    ],
    ids=["tables", "arrays", "just-past"],
)
def test_a_preset_nested_deeper_than_a_config_is_one_line(tmp_path, toml):
    """They overflowed Python's stack in tracebacks of 53 and 2,998 lines (config/load.py, keys.py)."""
    path = tmp_path / "deep.toml"
    path.write_text(toml)
    with pytest.raises(C.ConfigError, match="nests tables or arrays more than 16 deep") as err:
        C.load_preset(str(path))
    assert "\n" not in str(err.value)


def test_an_override_or_a_policy_setting_nested_too_deep_is_one_line():
    with pytest.raises(C.ConfigError, match="the value of override seed nests"):
        C.build("cartpole-ppo", ["seed=" + "[" * 3000 + "]" * 3000])
    with pytest.raises(C.ConfigError, match="policy_settings value nests arrays too deep"):
        C.build("tag-ppo", ["policy_settings=['agent:ppo.update_epochs=" + "[" * 3000 + "]" * 3000 + "']"])
    assert C.build("cartpole-ppo", ["policy.hidden_sizes=[32, 32]"]).policy.hidden_sizes == (32, 32)


def test_the_nesting_bound_is_16_levels_the_file_itself_one_of_them():
    from rlfarm.config.load import MAX_NESTING, nesting, read_toml

    deepest_ok = "v = " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)  # the file's table + 15 arrays
    assert nesting(read_toml(deepest_ok, "x")) == MAX_NESTING
    with pytest.raises(C.ConfigError, match="more than 16 deep"):
        read_toml("v = " + "[" * MAX_NESTING + "]" * MAX_NESTING, "x")

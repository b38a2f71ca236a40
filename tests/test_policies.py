"""Several policies in one run (env.policy_map, rlfarm.algos.group): agents mapped to policies,
agents of different spaces, a learner per policy on its own columns, frozen policies; unit tests on
mpe2's simple_adversary_v3 (1 adversary, 2 good agents: observations of 8 and 10 values), and runs
through a farm."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json

import numpy as np
import pytest
import torch

from rlfarm.config import RunConfig, build
from rlfarm.core.rollout import collect
from rlfarm.envs import make_vector_env, space_spec
from rlfarm.envs.agents import map_agents
from rlfarm.errors import ConfigError, EnvError

HAS_MPE2 = importlib.util.find_spec("mpe2") is not None
NO_MPE2 = 'needs mpe2 (the multiagent extra: pip install -e ".[multiagent]")'
needs_mpe2 = pytest.mark.skipif(not HAS_MPE2, reason=NO_MPE2)
ADV = "mpe2/simple_adversary_v3"
MAP = ("adversary_*=adversary", "agent_*=agent")


def _config(**changes) -> RunConfig:
    base = RunConfig()
    return dataclasses.replace(
        base,
        env=dataclasses.replace(base.env, id=ADV, num_envs=6, policy_map=MAP),
        farm=dataclasses.replace(base.farm, steps_per_env=50),
        policy=dataclasses.replace(base.policy, hidden_sizes=(16,)),
        **changes,
    )


def test_agents_take_the_policy_of_the_first_pattern_that_matches():
    agents = ["adversary_0", "agent_0", "agent_1"]
    assert map_agents(["adversary_*=red", "*=blue"], agents, ADV) == (("red", "blue", "blue"), ("red", "blue"))
    assert map_agents(["agent_1=solo", "agent_*=team", "*=red"], agents, ADV) == (
        ("red", "team", "solo"),
        ("solo", "team", "red"),
    )
    with pytest.raises(EnvError, match="no env.policy_map entry matches agent 'adversary_0'"):
        map_agents(["agent_*=team"], agents, ADV)


def test_a_bad_map_or_frozen_entry_is_one_line_before_anything_starts():
    with pytest.raises(ConfigError, match="is not 'pattern=policy'"):
        build(overrides=["env.policy_map=['adversary_*']"])
    with pytest.raises(ConfigError, match="frozen policy 'blue' is not in env.policy_map"):
        build(overrides=["env.policy_map=['*=red']", "frozen=['blue=x.safetensors']"])
    with pytest.raises(ConfigError, match="at least one must be trained"):
        build(overrides=["env.policy_map=['*=red']", "frozen=['red=x.safetensors']"])
    two = "env.policy_map=['a*=red', '*=blue']"
    for entry, error in (
        ("red-ppo.gamma=0.9", "is not 'policy:key=value'"),
        ("green:ppo.gamma=0.9", "names policy 'green', which is not in env.policy_map"),
        ("red:farm.num_tasks=2", r"only keys of the run's algorithm section \[ppo\] may differ per policy"),
        ("red:ppo.gama=0.9", "policy 'red': unknown config key 'ppo.gama' \\(did you mean ppo.gamma\\?\\)"),
        ("red:ppo.gamma=high", "policy 'red': ppo.gamma: expected a number, got 'high'"),
    ):
        with pytest.raises(ConfigError, match=error):
            build(overrides=[two, f"policy_settings=['{entry}']"])
    with pytest.raises(ConfigError, match="that policy is frozen"):
        build(overrides=[two, "frozen=['red=x.safetensors']", "policy_settings=['red:ppo.gamma=0.9']"])


@needs_mpe2
def test_agents_of_different_spaces_are_padded_and_each_policy_has_its_columns():
    envs = make_vector_env(ADV, 6, options={"policy_map": MAP})
    spec = space_spec(envs)
    assert spec.policies == ("adversary", "agent") and spec.agent_policy == (0, 1, 1)
    assert spec.agent_obs_dims == (8, 10, 10) and spec.obs_dim == 10
    assert spec.columns("adversary", 6).tolist() == [0, 3] and spec.columns("agent", 6).tolist() == [1, 2, 4, 5]
    assert spec.policy_spec("adversary").obs_dim == 8 and spec.policy_spec("agent").obs_dim == 10
    obs, _ = envs.reset(seed=3)
    assert (obs[[0, 3], 8:] == 0).all() and (obs[[1, 2], 8:] != 0).any()
    with pytest.raises(EnvError, match="different observation spaces"):
        make_vector_env(ADV, 3)  # one policy cannot act for both
    assert space_spec(make_vector_env("mpe2/simple_spread_v3", 3)).policies == ()  # no map: as before


@needs_mpe2
def test_each_policy_acts_for_its_own_columns_with_its_own_width():
    from rlfarm.algos import network_for

    envs = make_vector_env(ADV, 6, options={"policy_map": MAP})
    spec = space_spec(envs)
    torch.manual_seed(0)
    network = network_for("ppo", spec, _config().policy)
    actor = network.actor_snapshot()
    obs, _ = envs.reset(seed=1)
    actions, _, values = actor.act(obs.astype(np.float32), np.random.default_rng(0), deterministic=True)
    for name in spec.policies:
        cols, dim = spec.columns(name, 6), spec.policy_spec(name).obs_dim
        own = network.nets[name].actor_snapshot()
        a, _, v = own.act(obs[cols, :dim].astype(np.float32), np.random.default_rng(0), deterministic=True)
        assert (actions[cols] == a).all() and np.allclose(values[cols], v)
    # The values of some sub-envs only (collect's cut episodes): each row valued by its own agent's policy.
    rows = np.array([5, 0, 4])  # agent_1, adversary_0, agent_0
    assert np.allclose(actor.value(obs[rows].astype(np.float32), rows=rows), values[rows])


@needs_mpe2
def test_a_game_of_several_policies_is_scored_for_each_policy_by_its_own_agents():
    """Greedy games (evaluation, `rlfarm eval`): a column per policy, each its agents' mean return; the
    first column is what scores the run, as before."""
    from rlfarm.algos import network_for
    from rlfarm.core.rollout import run_episodes

    game = make_vector_env(ADV, 3, options={"policy_map": MAP})
    spec = space_spec(game)
    torch.manual_seed(0)
    actor = network_for("ppo", spec, _config().policy).actor_snapshot()
    table = run_episodes(actor, game, episodes=3, seed=11, by_policy=True)
    assert table.shape == (3, 2)
    assert np.array_equal(run_episodes(actor, game, episodes=3, seed=11), table[:, 0])
    # simple_adversary: the good agents share a reward, the adversary's is its own (not theirs).
    assert not np.allclose(table[:, 0], table[:, 1])
    solo = make_vector_env("mpe2/simple_spread_v3", 3)
    solo_actor = network_for("ppo", space_spec(solo), _config().policy).actor_snapshot()
    assert run_episodes(solo_actor, solo, episodes=2, seed=1, by_policy=True).shape == (2,)


@needs_mpe2
def test_a_learner_per_policy_learns_from_its_columns_and_a_frozen_one_never_changes():
    from rlfarm.algos import learner
    from rlfarm.algos.group import PolicyGroup, policy_rollout

    config = _config()
    envs = make_vector_env(ADV, 6, options={"policy_map": MAP})
    spec = space_spec(envs)
    torch.manual_seed(0)
    frozen_weights = PolicyGroup(config, spec, torch.device("cpu"), learner("ppo", "sync")).state()
    frozen = {"agent": {k[len("nets.agent.") :]: v for k, v in frozen_weights.items() if k.startswith("nets.agent.")}}
    group = PolicyGroup(config, spec, torch.device("cpu"), learner("ppo", "sync"), frozen)
    rollout = collect(_actor(group, spec), envs, 50, list(range(6)), 0)
    assert rollout.episode_columns is not None and len(rollout.episode_columns) == 12  # 2 games x 3 agents x 2
    own = policy_rollout(rollout, spec, "adversary")
    assert own.obs.shape == (50, 2, 8) and len(own.episode_returns) == 4
    before = {k: v.clone() for k, v in group.state().items()}  # (state() shares the weights)
    group.observe(rollout, 0)
    assert group.ready()
    metrics = group.update(0.0)
    assert np.isfinite(metrics["adversary/losses/policy_loss"]) and "agent/losses/policy_loss" not in metrics
    after = group.state()
    assert set(after) == set(before) and all(k.startswith(("nets.adversary.", "nets.agent.")) for k in after)
    assert all(torch.equal(after[k], frozen_weights[k]) for k in after if k.startswith("nets.agent."))
    assert any(not torch.equal(after[k], before[k]) for k in after if k.startswith("nets.adversary."))
    scalars = group.scalars(0.0)
    assert np.isfinite(scalars["adversary/episodic_return"]) and np.isfinite(scalars["agent/episodic_return"])
    # Checkpoint and restore: the next update is the same bit for bit.
    tensors, rest = group.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}  # as read back from a file: no shared storage
    twin = PolicyGroup(config, spec, torch.device("cpu"), learner("ppo", "sync"), frozen)
    twin.restore(tensors, rest)
    again = collect(_actor(group, spec), envs, 50, list(range(6, 12)), 1)
    for learner_ in (group, twin):
        learner_.observe(again, 0)
        learner_.update(0.5)
    assert all(torch.equal(group.state()[k], twin.state()[k]) for k in group.state())


@needs_mpe2
def test_a_policy_learns_with_its_own_settings_of_the_algorithm_section():
    """`policy_settings`: the agents' learner takes a learning rate of its own (so small its weights
    barely move), the adversary's the run's; the value reaches the learner's optimizer."""
    from rlfarm.algos import learner
    from rlfarm.algos.group import PolicyGroup
    from rlfarm.config import for_policy

    config = dataclasses.replace(_config(), policy_settings=("agent:ppo.learning_rate=1e-9", "agent:ppo.ent_coef=0.5"))
    assert for_policy(config, "agent").ppo.learning_rate == 1e-9 and for_policy(config, "agent").ppo.ent_coef == 0.5
    assert for_policy(config, "adversary") == config
    envs = make_vector_env(ADV, 6, options={"policy_map": MAP})
    spec = space_spec(envs)
    torch.manual_seed(0)
    group = PolicyGroup(config, spec, torch.device("cpu"), learner("ppo", "sync"))
    rollout = collect(_actor(group, spec), envs, 50, list(range(6)), 0)
    before = {k: v.clone() for k, v in group.state().items()}
    group.observe(rollout, 0)
    group.update(0.0)
    after = group.state()
    moved = {
        name: max((after[k] - before[k]).abs().max().item() for k in after if k.startswith(f"nets.{name}."))
        for name in ("adversary", "agent")
    }
    assert moved["agent"] < 1e-7 < 1e-5 < moved["adversary"], moved


def _actor(group, spec):
    from rlfarm.algos import network_for

    network = network_for("ppo", spec, group.run_config.policy)
    network.load_state_dict(group.state())
    return network.actor_snapshot()


# ---- through the farm ------------------------------------------------------------------------------
@pytest.mark.farm
@needs_mpe2
def test_two_policies_train_through_the_farm_and_a_frozen_one_acts_as_its_file(farm, tmp_path):
    from safetensors.torch import load_file

    from .conftest import read_summary, run_cli, train_on

    def train(run_id: str, *extra: str):
        sets = ["env.num_envs=6", "env.policy_map=['adversary_*=adversary', 'agent_*=agent']"]
        sets += ["farm.steps_per_env=100", "eval.episodes=2"]
        options = [part for value in sets for part in ("--set", value)]
        result = train_on(farm, tmp_path, run_id, "--env", ADV, "--total-steps", "2400", *options, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        return read_summary(tmp_path / run_id)

    video = ("--capture-video",) if importlib.util.find_spec("moviepy") is not None else ()
    assert train("teams", *video)["env_steps"] == 2400
    if video:  # a game of each evaluated version
        assert len(list((tmp_path / "teams" / "videos").glob("step-*-v*.mp4"))) >= 1
    with open(tmp_path / "teams" / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    for name in ("adversary", "agent"):
        assert all(row[f"{name}/episodic_return"] != "" for row in rows[1:])
        assert float(rows[-1][f"{name}/losses/entropy"]) > 0
    trained = tmp_path / "teams" / "final_policy.safetensors"
    train("frozen-agents", "--set", f"frozen=['agent={trained}']")
    first, second = load_file(trained), load_file(tmp_path / "frozen-agents" / "final_policy.safetensors")
    assert all(torch.equal(first[k], second[k]) for k in first if k.startswith("nets.agent."))
    assert not all(torch.equal(first[k], second[k]) for k in first if k.startswith("nets.adversary."))
    # `rlfarm eval` builds the group's network from the file and plays its games, a line per policy.
    played = run_cli("eval", str(tmp_path / "teams"), "--episodes", "2")
    assert played.returncode == 0 and "mean return" in played.stdout, played.stderr
    assert "policy adversary: mean return" in played.stdout and "policy agent: mean return" in played.stdout

    # Each policy's best evaluation: its column in evals.csv, its file and its entry in summary.json.
    summary = read_summary(tmp_path / "teams")
    with open(tmp_path / "teams" / "evals.csv") as f:
        evals = list(csv.DictReader(f))
    for name in ("adversary", "agent"):
        best = summary["policies"][name]
        assert best["best_eval_mean_return"] == pytest.approx(
            max(float(row[f"{name}/mean_return"]) for row in evals), abs=1e-3
        )
        own = load_file(best["best_policy"])
        assert own and not any(k.startswith("nets.") for k in own)  # a single policy's file
    assert summary["policies"]["adversary"]["best_version"] == summary["best_version"]  # the first scores the run
    status = run_cli("status", "--json", "--redis", farm.redis_url)  # the trainer's last word, per policy
    assert status.returncode == 0, status.stderr
    [teams] = [r for r in json.loads(status.stdout)["runs"] if r["run_id"] == "teams"]
    assert teams["heartbeat"]["policy_evals"] == {
        name: pytest.approx(summary["policies"][name]["eval_mean_return"], abs=0.01) for name in ("adversary", "agent")
    }
    # Another policy file for one side (its best, a single policy's file), by name.
    best_agent = summary["policies"]["agent"]["best_policy"]
    swapped = run_cli("eval", str(tmp_path / "teams"), "--episodes", "2", "--policy-for", f"agent={best_agent}")
    assert swapped.returncode == 0 and "policy agent: mean return" in swapped.stdout, swapped.stderr
    unknown = run_cli("eval", str(tmp_path / "teams"), "--policy-for", f"prey={best_agent}")
    assert unknown.returncode == 2 and "has no policy 'prey' (its policies are adversary, agent)" in unknown.stderr
    alone = run_cli("eval", "--policy", best_agent, "--env", ADV)
    assert alone.returncode != 0 and "--policy-for agent=FILE" in alone.stderr
    if importlib.util.find_spec("moviepy") is not None:  # a game a file, as single-agent episodes are
        videos = tmp_path / "videos"
        recorded = run_cli("eval", str(tmp_path / "teams"), "--episodes", "2", "--video", str(videos))
        assert recorded.returncode == 0, recorded.stderr[-3000:]
        assert sorted(p.name for p in videos.glob("*.mp4")) == [
            f"ppo-mpe2-simple_adversary_v3-policy{summary['best_version']}-episode-{k}.mp4" for k in (0, 1)
        ]
        assert all(p.stat().st_size > 1000 for p in videos.glob("*.mp4"))


@needs_mpe2
@pytest.mark.process
@pytest.mark.parametrize("preset", ["tag-ppo", "connect-four-ppo"])
def test_eval_render_shows_a_game_of_several_agents_or_a_turn_based_one(tmp_path, preset):
    """`rlfarm eval --render` plays a game of several policies (two teams) or a turn-based game in a
    window; SDL's dummy video driver, asked for by name, stands in for a display here."""
    from tests.conftest import run_cli
    from tests.test_load import save_fresh

    path = tmp_path / "best_policy.safetensors"
    save_fresh(path, preset)
    result = run_cli(
        "eval", "--policy", str(path), "--render", "--episodes", "1", env={"SDL_VIDEODRIVER": "dummy", "DISPLAY": ""}
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mean return" in result.stdout and "over 1 greedy episodes" in result.stdout

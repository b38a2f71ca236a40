"""TD3's parts alone (no Redis, no Celery): the deterministic action on the learner and on the worker
alike, mapped to asymmetric bounds; exploration noise in unit scale, clipped to the bounds; heatup
acting uniformly in the bounds; target policy smoothing clipped; the actor and the targets moving only
every policy_delay critic steps; checkpoint -> restore -> update bit-identical in everything the
learner holds; a saved TD3 policy played back as `rlfarm eval` does."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.algos.saved import algo_of, describe_policy, load_network
from rlfarm.algos.td3.policies import DeterministicPolicy, NumpyTD3Actor, TorchTD3Actor
from rlfarm.core import codec
from rlfarm.core.rollout import collect
from rlfarm.envs import SpaceSpec, describe, make_vector_env
from rlfarm.errors import PolicyMismatch

BOUNDS = "tests.tiny_envs:bounds"  # low [-1, 0], high [3, 10]
LOW, HIGH = np.array([-1.0, 0.0]), np.array([3.0, 10.0])
SCALE, MID = (HIGH - LOW) / 2, (HIGH + LOW) / 2
SMALL = ["td3.batch_size=32", "td3.buffer_size=4096", "policy.hidden_sizes=[32, 32]"]


def make_td3(env: str = BOUNDS, overrides: tuple[str, ...] = (), seed: int = 0):
    cfg = C.build(None, ["algo=td3", "mode=async", f"env.id={env}", "env.num_envs=2", *SMALL, *overrides], seed=seed)
    torch.manual_seed(seed)
    return learner("td3", "async")(cfg, describe(env), torch.device("cpu"))


def rollout(algorithm, seed: int, steps: int = 64):
    actor = algorithm.policy.actor_snapshot().with_options(**algorithm.acting(0.0))
    envs = make_vector_env(BOUNDS, 2)
    return collect(actor, envs, steps, [seed, seed + 1], seed, keep_next_obs=True), envs


def received(envs) -> np.ndarray:
    return np.stack([np.stack(env.unwrapped.received) for env in envs.envs], axis=1)


def asymmetric_spec() -> SpaceSpec:
    return SpaceSpec(2, False, 2, tuple(LOW), tuple(HIGH))


def learned_policy(seed: int = 3, hidden: tuple[int, ...] = (32, 32)) -> DeterministicPolicy:
    """A policy that has learned something: actions spread over the bounds, not all near the middle."""
    torch.manual_seed(seed)
    policy = DeterministicPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=hidden, activation="relu"))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return policy


def constant_action(policy: DeterministicPolicy, pre_tanh: float | list[float]) -> None:
    with torch.no_grad():
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.copy_(torch.as_tensor(pre_tanh, dtype=torch.float32).expand(policy.spec.action_dim))


# ---- the deterministic action, in the env's bounds ---------------------------------------------------


def test_the_greedy_action_is_the_networks_mapped_to_asymmetric_bounds():
    """Numpy snapshot (MLPs), torch copy (CNNs) and learner: bias + scale * tanh(actor(s)), exactly the
    network's action; greedy acting ignores the exploration noise."""
    policy = learned_policy()
    obs = np.random.default_rng(2).normal(size=(64, 2)).astype(np.float32)
    with torch.no_grad():
        unit = policy(torch.from_numpy(obs))
        expected = (policy.action_bias + policy.action_scale * unit).numpy()
    np.testing.assert_allclose(policy.to_env(unit).numpy(), expected)
    assert np.ptp(expected, axis=0).min() > 0.5 * SCALE.min()  # spread over the bounds, not one point
    np.testing.assert_allclose(expected, MID + SCALE * unit.numpy(), rtol=1e-6, atol=1e-6)  # the mapping itself
    assert type(policy.actor_snapshot()) is NumpyTD3Actor
    for actor in (policy.actor_snapshot(), TorchTD3Actor(policy)):
        for acting in (actor, actor.with_options(noise=0.5), actor.with_options(random=True)):
            action, logprob, value = acting.act(obs, np.random.default_rng(0), deterministic=True)
            assert action.dtype == np.float32 and action.shape == (64, 2)
            np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)
            assert not logprob.any() and not value.any()


@pytest.mark.parametrize("pre_tanh, expected", [(0.0, MID), (30.0, HIGH), (-30.0, LOW)])
def test_saturated_and_zero_actions_sit_on_the_bounds_and_the_midpoints(pre_tanh, expected):
    policy = DeterministicPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(16,)))
    constant_action(policy, pre_tanh)
    obs = np.random.default_rng(1).normal(size=(5, 2)).astype(np.float32)
    action, _, _ = policy.actor_snapshot().act(obs, np.random.default_rng(0), deterministic=True)
    np.testing.assert_allclose(action, np.broadcast_to(expected, (5, 2)), atol=1e-6)
    assert (action >= LOW.astype(np.float32)).all() and (action <= HIGH.astype(np.float32)).all()


def test_a_fresh_policy_acts_near_the_midpoints():
    """The last layer starts near 0 (std 0.01): early actions are not stuck at a bound."""
    policy = DeterministicPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(64, 64)))
    obs = np.random.default_rng(0).normal(size=(100, 2)).astype(np.float32)
    action, _, _ = policy.actor_snapshot().act(obs, np.random.default_rng(0), deterministic=True)
    assert (np.abs(action - MID) < 0.1 * SCALE).all()


# ---- exploration --------------------------------------------------------------------------------------


def test_exploration_noise_is_gaussian_in_unit_scale():
    """noise = std in [-1, 1] units: in env units, std times each dimension's half-range, centred on
    the deterministic action."""
    policy = DeterministicPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(8,)))
    constant_action(policy, [0.3, -0.2])
    mu = MID + SCALE * np.tanh([0.3, -0.2])
    actor = policy.actor_snapshot().with_options(noise=0.1)
    assert policy.actor_snapshot().noise == 0.0  # with_options made a copy
    obs = np.zeros((20_000, 2), np.float32)
    action, _, _ = actor.act(obs, np.random.default_rng(0))
    unit_noise = (action.astype(np.float64) - mu) / SCALE
    np.testing.assert_allclose(unit_noise.std(0), [0.1, 0.1], rtol=0.03)
    np.testing.assert_allclose(unit_noise.mean(0), [0.0, 0.0], atol=0.003)
    np.testing.assert_allclose(action.std(0), 0.1 * SCALE, rtol=0.03)  # 0.2 and 0.5 in env units
    # The same task seed gives the same noise (a task is a pure function of its spec).
    np.testing.assert_array_equal(
        actor.act(obs[:8], np.random.default_rng(5))[0], actor.act(obs[:8], np.random.default_rng(5))[0]
    )
    # No noise: the deterministic action.
    quiet, _, _ = policy.actor_snapshot().with_options(noise=0.0).act(obs[:8], np.random.default_rng(0))
    np.testing.assert_allclose(quiet, np.broadcast_to(mu, (8, 2)), atol=1e-6)


def test_exploration_near_a_bound_is_clipped_to_it():
    """A policy at 0.95 of the high side with noise 0.5: about half the actions would leave the bounds;
    they are clipped onto the bound, and every action is one the env accepts."""
    policy = DeterministicPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(8,)))
    constant_action(policy, math.atanh(0.95))
    actor = policy.actor_snapshot().with_options(noise=0.5)
    action, _, _ = actor.act(np.zeros((4000, 2), np.float32), np.random.default_rng(1))
    assert (action >= LOW.astype(np.float32)).all() and (action <= HIGH.astype(np.float32)).all()
    at_high = (action == HIGH.astype(np.float32)).mean(0)
    assert (np.abs(at_high - 0.46) < 0.05).all(), at_high  # P(N(0.95, 0.5) > 1) = 0.46
    assert (action < MID.astype(np.float32)).any()  # noise reaches below the midpoints too (P = 0.03)
    with pytest.raises(ValueError, match="exploration noise must be a finite std"):
        policy.actor_snapshot().with_options(noise=-0.1)
    with pytest.raises(ValueError, match="takes no acting options"):
        policy.actor_snapshot().with_options(epsilon=0.1)


def test_actions_stored_are_the_actions_the_env_was_given():
    """collect's clip to the bounds is a no-op for TD3's actions: replay holds what the env saw."""
    algorithm = make_td3(overrides=("td3.learning_starts=0", "td3.exploration_noise=0.3"))
    assert algorithm.acting(0.0) == {"noise": 0.3}
    with torch.no_grad():  # far out: tanh saturates, noise pushes half the actions past the bounds
        algorithm.policy.actor[-1].bias.copy_(torch.tensor([40.0, -40.0]))
    r, envs = rollout(algorithm, seed=4, steps=30)
    np.testing.assert_array_equal(r.actions, received(envs))
    assert r.actions.dtype == np.float32 and r.actions.shape == (30, 2, 2)
    assert (r.actions[..., 0] <= np.float32(3.0)).all() and (r.actions[..., 0] == np.float32(3.0)).mean() > 0.3
    assert (r.actions[..., 1] >= np.float32(0.0)).all() and (r.actions[..., 1] == np.float32(0.0)).mean() > 0.3
    assert (r.actions[..., 0] < np.float32(3.0)).any()  # noise moved some inside


def test_heatup_tasks_act_uniformly_in_the_bounds():
    algorithm = make_td3(overrides=("td3.learning_starts=2000",))
    assert algorithm.acting(0.0) == {"random": True}
    r, envs = rollout(algorithm, seed=5, steps=500)
    actions = r.actions.reshape(-1, 2).astype(np.float64)
    assert (actions >= LOW).all() and (actions <= HIGH).all()
    # uniform: each quarter of each dimension's range holds a quarter of the 1,000 actions
    quarters = np.floor((actions - LOW) / (HIGH - LOW) * 4).clip(0, 3)
    for dim in range(2):
        counts = np.bincount(quarters[:, dim].astype(int), minlength=4)
        assert (np.abs(counts - 250) < 60).all(), counts
    assert (np.abs(actions.mean(0) - MID) < 0.05 * (HIGH - LOW)).all()
    np.testing.assert_array_equal(r.actions, received(envs))
    # Heatup ends with learning_starts observed transitions: then tasks act with the policy and noise.
    algorithm.observe(r, policy_lag=0)
    assert not algorithm.ready()
    algorithm.observe(rollout(algorithm, seed=6, steps=500)[0], policy_lag=0)
    assert algorithm.acting(0.5) == {"noise": 0.1} and algorithm.ready()


# ---- the learner ----------------------------------------------------------------------------------------


def test_target_policy_smoothing_is_clipped_noise_around_the_target_actor():
    algorithm = make_td3(overrides=("td3.target_policy_noise=0.2", "td3.target_noise_clip=0.25"))
    next_obs = torch.randn(20_000, 2)
    with torch.no_grad():
        mu = algorithm.policy_target(next_obs)
        smoothed = algorithm.smoothed_target_actions(next_obs)
    assert (mu.abs() < 0.9).all()  # so the [-1, 1] clip below does not cut the noise
    noise = (smoothed - mu).numpy()
    assert np.abs(noise).max() <= 0.25 + 1e-6
    clipped = np.isclose(np.abs(noise), 0.25, atol=1e-6).mean()
    assert abs(clipped - 0.211) < 0.02, clipped  # P(|N(0, 0.2)| >= 0.25) = 0.211
    inside = noise[np.abs(noise) < 0.2499]
    assert abs(inside.std() - 0.1298) < 0.005  # the std of N(0, 0.2) truncated to +-0.25
    # Near a bound the smoothed action is clipped to [-1, 1] too.
    constant_action(algorithm.policy_target, 5.0)
    with torch.no_grad():
        edge = algorithm.smoothed_target_actions(next_obs[:2000])
    assert edge.max().item() == 1.0 and edge.min().item() >= 1.0 - 1e-4 - 0.25
    assert (edge == 1.0).float().mean().item() > 0.4


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def _changed(before: dict[str, torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_the_actor_and_the_targets_move_only_every_policy_delay_critic_steps():
    """policy_delay 3: the critics learn at every gradient step; the actor at steps 3 and 6 only, and
    the target actor and critics then (only then) move by Polyak, tau of the way."""
    tau = 0.05
    algorithm = make_td3(
        overrides=("td3.learning_starts=0", "td3.replay_ratio=0.1", "td3.policy_delay=3", f"td3.tau={tau}")
    )
    algorithm.observe(rollout(algorithm, seed=1)[0], policy_lag=0)  # 12 gradient steps owed
    nets = ("policy", "policy_target", "qf1", "qf2", "qf1_target", "qf2_target")
    for step in range(1, 7):
        before = {name: _snapshot(getattr(algorithm, name)) for name in nets}
        metrics = algorithm.update(0.1)
        assert algorithm.gradient_steps == step
        moved = {name: _changed(before[name], getattr(algorithm, name)) for name in nets}
        delayed = step % 3 == 0
        assert moved == {
            "policy": delayed,
            "policy_target": delayed,
            "qf1": True,
            "qf2": True,
            "qf1_target": delayed,
            "qf2_target": delayed,
        }, (step, moved)
        assert math.isnan(metrics["losses/actor_loss"]) == (step < 3)
        if delayed:  # Polyak: target <- (1 - tau) target + tau online, from the online nets after their step
            for target, online in (("policy_target", "policy"), ("qf1_target", "qf1"), ("qf2_target", "qf2")):
                now, learned = getattr(algorithm, target).state_dict(), getattr(algorithm, online).state_dict()
                for key, value in before[target].items():
                    if key in learned and value.is_floating_point() and not key.startswith("obs_norm"):
                        torch.testing.assert_close(now[key], (1 - tau) * value + tau * learned[key])


def test_the_actor_loss_is_minus_q1_of_the_actors_action():
    algorithm = make_td3(overrides=("td3.learning_starts=0", "td3.replay_ratio=0.1", "td3.policy_delay=1"))
    algorithm.observe(rollout(algorithm, seed=2)[0], policy_lag=0)
    obs = torch.from_numpy(algorithm.replay.obs[:32])
    with torch.no_grad():
        expected = -algorithm.qf1(obs, algorithm.policy(obs)).mean().item()
    got = algorithm._policy_step(obs, obs)["losses/actor_loss"]
    assert got == pytest.approx(expected, rel=1e-6)
    assert all(p.grad is None or not p.grad.any() for p in algorithm._q_params)  # the critics untouched


def train(algorithm, r) -> dict[str, float]:
    algorithm.observe(r, policy_lag=0)
    metrics = {}
    while algorithm.ready():
        metrics = algorithm.update(0.3)
    return metrics


@pytest.mark.parametrize(
    "overrides", [(), ("td3.prioritized=true", "td3.n_step=3", "td3.policy_delay=3"), ("policy.normalize_obs=true",)]
)
def test_checkpoint_restore_update_is_bit_identical_in_everything(overrides):
    """Actor, critics and their three targets, both optimizers, the replay buffer and its sampler, the
    smoothing noise's generator, observation statistics: all come back, and the next updates (an odd
    number, so the delayed step falls differently in the second batch) are the same."""
    overrides = ("td3.learning_starts=0", "td3.replay_ratio=0.1", *overrides)
    whole = make_td3(overrides=overrides)
    first = rollout(whole, seed=1, steps=65)[0]
    train(whole, first)
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}
    second = rollout(whole, seed=2)[0]
    expected = train(whole, second)

    resumed = make_td3(overrides=overrides, seed=42)  # other weights and generator: all must come back
    resumed.restore(tensors, state)
    got = train(resumed, second)
    assert got == expected and math.isfinite(got["losses/actor_loss"])
    a, b = whole.checkpoint(), resumed.checkpoint()
    assert a[0].keys() == b[0].keys() and a[1] == b[1]
    different = [k for k in a[0] if not torch.equal(a[0][k], b[0][k])]
    assert not different
    prefixes = {k.split(".")[0] for k in a[0]}
    assert {
        "actor",
        "actor_target",
        "qf1",
        "qf2",
        "qf1_target",
        "qf2_target",
        "q_optim",
        "actor_optim",
        "rng",
        "replay",
    } <= prefixes


def test_observation_statistics_are_one_set_for_the_actor_its_target_and_the_critics():
    algorithm = make_td3(overrides=("td3.learning_starts=0", "policy.normalize_obs=true"))
    assert algorithm.policy_target.obs_norm is algorithm.policy.obs_norm
    r = rollout(algorithm, seed=3)[0]
    train(algorithm, r)
    assert algorithm.policy.obs_norm.count.item() == r.obs.shape[0] * r.obs.shape[1]
    assert "obs_norm.mean" in algorithm.state()  # workers act with the statistics


# ---- config, spaces and saved policies ------------------------------------------------------------------


def test_td3_refuses_discrete_and_unbounded_action_spaces_sync_and_bad_values():
    section = C.ALGORITHMS["td3"]
    with pytest.raises(C.ConfigError, match=r"algo 'td3' needs a Box \(continuous\) action space.*use ppo or dqn"):
        section.check_spaces(describe("CartPole-v1"))
    with pytest.raises(C.ConfigError, match="maps its tanh actions to the action space's bounds and needs finite"):
        section.check_spaces(describe("tests.tiny_envs:unbounded"))
    section.check_spaces(describe(BOUNDS))
    with pytest.raises(C.ConfigError, match="algo 'td3' cannot run in --mode sync.*off-policy"):
        section.check_mode("sync")
    for key, message in (
        ("td3.tau=0", r"td3.tau must be in \(0, 1\]"),
        ("td3.policy_delay=0", "td3.policy_delay must be at least 1"),
        ("td3.target_noise_clip=-0.5", "td3.target_noise_clip must be a finite number, 0 or more"),
        ("td3.exploration_noise=-0.1", "td3.exploration_noise must be"),
        ("td3.batch_size=0", "td3.batch_size must be at least 1"),
    ):
        with pytest.raises(C.ConfigError, match=message):
            C.build("pendulum-td3", [key])


def test_a_saved_td3_policy_plays_back_and_is_not_taken_for_a_discrete_policy(tmp_path):
    """As the trainer publishes a version and `rlfarm eval` reads best_policy.safetensors: the file
    names td3, is built as TD3's deterministic actor for Pendulum and acts with continuous actions;
    an env of discrete actions refuses it, saying it acts with continuous ones."""
    from rlfarm.evaluation import playback

    algorithm = make_td3(env="Pendulum-v1")
    with torch.no_grad():
        # A policy that is not the fresh one, whose action is known: tanh(0.5) of the bounds, any obs.
        algorithm.policy.actor[-1].weight.zero_()
        algorithm.policy.actor[-1].bias.fill_(0.5)
    spec = describe("Pendulum-v1")
    path = tmp_path / "best_policy.safetensors"
    meta = {"env": "Pendulum-v1", "policy": '{"hidden_sizes": [32, 32]}', **describe_policy("td3", spec)}
    path.write_bytes(codec.encode_policy(algorithm.state(), meta))

    stored = playback.from_file(path)
    assert stored.algo == "td3" == algo_of(stored.meta, stored.state)
    assert "action_scale" not in stored.state  # the bounds come from the env, not the file
    env, env_id = playback.open_env(stored)
    network = playback.network_for(stored, env, env_id)
    assert type(network) is DeterministicPolicy
    assert all(np.array_equal(stored.state[k], v.numpy()) for k, v in network.state_dict().items())
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    action, _, _ = learner("td3").actor_snapshot(network).act(obs, np.random.default_rng(0), deterministic=True)
    assert action.dtype == np.float32 and action.shape == (4, 1)
    np.testing.assert_allclose(action, 2.0 * np.tanh(0.5), atol=1e-6)  # Pendulum's bounds are +-2
    returns = playback.play(playback.actor_for(stored, env, env_id), env, env_id, episodes=2, seed=3)
    assert returns.shape == (2,) and np.isfinite(returns).all()

    with pytest.raises(PolicyMismatch, match="it acts with 1-dimensional continuous actions, the env takes 2 discrete"):
        load_network("td3", describe("CartPole-v1"), C.PolicyConfig(hidden_sizes=(32, 32)), stored.state, stored.meta)
    with pytest.raises(PolicyMismatch, match="it takes observations of size 3, the env's have size 2"):
        load_network("td3", describe(BOUNDS), C.PolicyConfig(hidden_sizes=(32, 32)), stored.state, stored.meta)

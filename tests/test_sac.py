"""SAC's parts alone (no Redis, no Celery): the squashed Gaussian's log-probability, actions scaled to
asymmetric bounds on the learner and on the worker alike, heatup acting uniformly in the bounds, and
checkpoint -> restore -> update bit-identical in everything the learner holds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.algos.sac.acting import NumpySACActor, np_tanh_log_det
from rlfarm.algos.sac.policies import SquashedGaussianPolicy, TorchSACActor, tanh_log_det
from rlfarm.algos.saved import load_network
from rlfarm.core.rollout import collect
from rlfarm.envs import SpaceSpec, describe, make_vector_env
from rlfarm.errors import PolicyMismatch

BOUNDS = "tests.tiny_envs:bounds"  # low [-1, 0], high [3, 10]
LOW, HIGH = np.array([-1.0, 0.0]), np.array([3.0, 10.0])
SMALL = ["sac.batch_size=32", "sac.buffer_size=4096", "policy.hidden_sizes=[32, 32]"]


def make_sac(env: str = BOUNDS, overrides: tuple[str, ...] = (), seed: int = 0):
    cfg = C.build(None, ["algo=sac", "mode=async", f"env.id={env}", "env.num_envs=2", *SMALL, *overrides], seed=seed)
    torch.manual_seed(seed)
    return learner("sac", "async")(cfg, describe(env), torch.device("cpu"))


def rollout(algorithm, seed: int, steps: int = 64):
    actor = algorithm.policy.actor_snapshot().with_options(**algorithm.acting(0.0))
    envs = make_vector_env(BOUNDS, 2)
    return collect(actor, envs, steps, [seed, seed + 1], seed, keep_next_obs=True), envs


def asymmetric_spec() -> SpaceSpec:
    return SpaceSpec(2, False, 2, tuple(LOW), tuple(HIGH))


# ---- the squashed Gaussian ---------------------------------------------------------------------------


def test_tanh_log_det_is_stable_where_the_direct_form_is_not():
    u = torch.tensor([-30.0, -9.0, -1.0, 0.0, 0.5, 4.0, 9.0, 30.0], dtype=torch.float64)
    expected = torch.log(1 - torch.tanh(u) ** 2)  # float64: exact enough up to |u| ~ 18
    assert torch.allclose(tanh_log_det(u)[1:-1], expected[1:-1], rtol=1e-10, atol=1e-12)
    assert torch.isfinite(tanh_log_det(u.float())).all()  # float32 1 - tanh^2 is 0 at |u| = 9 or more
    assert tanh_log_det(u)[0].item() == pytest.approx(2 * (math.log(2) - 30.0))  # log(4 e^-2|u|)
    np.testing.assert_allclose(np_tanh_log_det(u.numpy()), tanh_log_det(u).numpy(), rtol=1e-12)


def test_squashed_log_prob_matches_the_change_of_variables():
    """log pi(tanh u) = log N(u) - sum log(1 - tanh(u)^2), as torch's TanhTransform computes it."""
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(16,)))
    obs = torch.randn(64, 2)
    generator = torch.Generator().manual_seed(1)
    unit, logprob = policy.sample(obs, generator)
    mean, log_std = policy(obs)
    squashed = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()), [torch.distributions.TanhTransform()]
    )
    expected = squashed.log_prob(unit).sum(-1)
    assert torch.allclose(logprob, expected, atol=1e-4), (logprob - expected).abs().max()
    # and by hand, from the same noise
    noise = torch.randn(mean.shape, generator=torch.Generator().manual_seed(1))
    u = mean + log_std.exp() * noise
    by_hand = (torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - torch.log(1 - torch.tanh(u) ** 2)).sum(-1)
    assert torch.allclose(unit, torch.tanh(u)) and torch.allclose(logprob, by_hand, atol=1e-4)


def test_the_worker_log_prob_is_the_learners():
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(16, 16)))
    obs = np.random.default_rng(0).normal(size=(32, 2)).astype(np.float32)
    action, logprob, value = policy.actor_snapshot().act(obs, np.random.default_rng(3))
    unit = policy.to_unit(torch.from_numpy(action)).double().clamp(-1 + 1e-6, 1 - 1e-6)
    mean, log_std = (t.double() for t in policy(torch.from_numpy(obs)))
    u = torch.atanh(unit)
    expected = (torch.distributions.Normal(mean, log_std.exp()).log_prob(u) - tanh_log_det(u)).sum(-1)
    np.testing.assert_allclose(logprob, expected.detach().numpy(), atol=2e-3)
    assert value.shape == (32,) and not value.any()


# ---- actions in the env's bounds ---------------------------------------------------------------------


def _constant_mean(policy: SquashedGaussianPolicy, mean: float) -> None:
    with torch.no_grad():
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.fill_(mean)


@pytest.mark.parametrize("mean, expected", [(0.0, (LOW + HIGH) / 2), (30.0, HIGH), (-30.0, LOW)])
def test_greedy_actions_scale_to_asymmetric_bounds(mean, expected):
    """A zero-mean policy acts at the midpoints; saturated means at the bounds, on both actors."""
    spec = asymmetric_spec()
    torch.manual_seed(0)
    policy = SquashedGaussianPolicy(spec, C.PolicyConfig(hidden_sizes=(16,)))
    _constant_mean(policy, mean)
    obs = np.random.default_rng(1).normal(size=(5, 2)).astype(np.float32)
    with torch.no_grad():
        learner_action = policy.to_env(policy.greedy(torch.from_numpy(obs))).numpy()
    worker_action, _, _ = policy.actor_snapshot().act(obs, np.random.default_rng(0), deterministic=True)
    for action in (learner_action, worker_action):
        np.testing.assert_allclose(action, np.broadcast_to(expected, (5, 2)), atol=1e-6)
        assert (action >= LOW.astype(np.float32)).all() and (action <= HIGH.astype(np.float32)).all()


def test_numpy_and_torch_actors_act_as_the_policy_does():
    """Same weights, same greedy action: the numpy snapshot workers act with, the torch copy (CNNs)
    and the learner's own network; and the same samples from the same generator."""
    spec = asymmetric_spec()
    torch.manual_seed(3)
    policy = SquashedGaussianPolicy(spec, C.PolicyConfig(hidden_sizes=(32, 32), activation="relu"))
    with torch.no_grad():  # a policy that has learned something: means and log-stds away from 0
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
    obs = np.random.default_rng(2).normal(size=(64, 2)).astype(np.float32)
    with torch.no_grad():
        greedy = policy.to_env(policy.greedy(torch.from_numpy(obs))).numpy()
    numpy_actor, torch_actor = policy.actor_snapshot(), TorchSACActor(policy)
    assert type(policy.actor_snapshot()) is NumpySACActor
    for actor in (numpy_actor, torch_actor):
        action, _, _ = actor.act(obs, np.random.default_rng(0), deterministic=True)
        assert action.dtype == np.float32 and action.shape == (64, 2)
        np.testing.assert_allclose(action, greedy, rtol=1e-5, atol=1e-5)
    sampled = [actor.act(obs, np.random.default_rng(7))[0] for actor in (numpy_actor, torch_actor)]
    np.testing.assert_allclose(sampled[0], sampled[1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(sampled[0], greedy)


def test_actions_stored_are_the_actions_the_env_was_given():
    """collect's clip to the bounds is a no-op for SAC's actions: replay holds what the env saw."""
    algorithm = make_sac(overrides=("sac.learning_starts=0",))
    with torch.no_grad():  # means far out: tanh saturates, the scaled actions sit on the bounds
        algorithm.policy.actor[-1].bias.copy_(torch.tensor([40.0, -40.0]))
    r, envs = rollout(algorithm, seed=4, steps=30)
    received = np.stack([np.stack(env.unwrapped.received) for env in envs.envs], axis=1)
    np.testing.assert_array_equal(r.actions, received)
    assert r.actions.dtype == np.float32 and r.actions.shape == (30, 2, 2)
    assert (r.actions[..., 0] == np.float32(3.0)).all() and (r.actions[..., 1] == np.float32(0.0)).all()


def test_heatup_tasks_act_uniformly_in_the_bounds():
    algorithm = make_sac(overrides=("sac.learning_starts=2000",))
    assert algorithm.acting(0.0) == {"random": True}
    r, envs = rollout(algorithm, seed=5, steps=500)
    actions = r.actions.reshape(-1, 2).astype(np.float64)
    assert (actions >= LOW).all() and (actions <= HIGH).all()
    # uniform: each quarter of each dimension's range holds a quarter of the 1,000 actions
    quarters = np.floor((actions - LOW) / (HIGH - LOW) * 4).clip(0, 3)
    for dim in range(2):
        counts = np.bincount(quarters[:, dim].astype(int), minlength=4)
        assert (np.abs(counts - 250) < 60).all(), counts
    assert (np.abs(actions.mean(0) - (LOW + HIGH) / 2) < 0.05 * (HIGH - LOW)).all()
    received = np.stack([np.stack(env.unwrapped.received) for env in envs.envs], axis=1)
    np.testing.assert_array_equal(r.actions, received)
    # Heatup ends with learning_starts observed transitions: then tasks sample the policy.
    algorithm.observe(r, policy_lag=0)
    assert not algorithm.ready()
    algorithm.observe(rollout(algorithm, seed=6, steps=500)[0], policy_lag=0)
    assert algorithm.acting(0.5) == {} and algorithm.ready()


def test_a_random_acting_actor_ignores_its_network_and_greedy_evaluation_never_explores():
    policy = SquashedGaussianPolicy(asymmetric_spec(), C.PolicyConfig(hidden_sizes=(8,)))
    _constant_mean(policy, 0.0)
    actor = policy.actor_snapshot().with_options(random=True)
    obs = np.zeros((4, 2), np.float32)
    greedy, _, _ = actor.act(obs, np.random.default_rng(0), deterministic=True)
    np.testing.assert_allclose(greedy, np.broadcast_to((LOW + HIGH) / 2, (4, 2)), atol=1e-6)
    assert policy.actor_snapshot().random is False  # with_options made a copy


# ---- the learner -------------------------------------------------------------------------------------


def train(algorithm, r) -> dict[str, float]:
    algorithm.observe(r, policy_lag=0)
    metrics = {}
    while algorithm.ready():
        metrics = algorithm.update(0.3)
    return metrics


@pytest.mark.parametrize(
    "overrides",
    [(), ("sac.prioritized=true", "sac.n_step=3", "sac.policy_frequency=1"), ("sac.autotune=false", "sac.alpha=0.1")],
)
def test_checkpoint_restore_update_is_bit_identical_in_everything(overrides):
    """Networks, target critics, log_alpha and the three optimizers, the replay buffer and its
    sampler, the learner's noise generator: all come back, and the next updates are the same."""
    overrides = ("sac.learning_starts=0", "sac.replay_ratio=0.1", *overrides)
    whole = make_sac(overrides=overrides)
    first = rollout(whole, seed=1)[0]
    train(whole, first)
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}
    second = rollout(whole, seed=2)[0]
    expected = train(whole, second)

    resumed = make_sac(overrides=overrides, seed=42)  # other weights and generator: all must come back
    resumed.restore(tensors, state)
    got = train(resumed, second)
    assert got == expected
    a, b = whole.checkpoint(), resumed.checkpoint()
    assert a[0].keys() == b[0].keys() and a[1] == b[1]
    different = [k for k in a[0] if not torch.equal(a[0][k], b[0][k])]
    assert not different
    prefixes = {k.split(".")[0] for k in a[0]}
    assert {
        "actor",
        "qf1",
        "qf2",
        "qf1_target",
        "qf2_target",
        "log_alpha",
        "q_optim",
        "actor_optim",
        "rng",
        "replay",
    } <= prefixes
    assert ("alpha_optim" in prefixes) == whole.config.autotune  # Adam's moments of log_alpha


def test_learning_moves_alpha_and_the_targets_follow_the_critics_slowly():
    algorithm = make_sac(overrides=("sac.learning_starts=0", "sac.replay_ratio=0.25", "sac.tau=0.01"))
    before = {k: v.clone() for k, v in algorithm.qf1_target.state_dict().items()}
    metrics = train(algorithm, rollout(algorithm, seed=3)[0])
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["losses/alpha"] != 1.0  # autotune moved it from initial_alpha
    moved = [k for k, v in algorithm.qf1_target.state_dict().items() if not torch.equal(v, before[k])]
    assert moved
    online = algorithm.qf1.state_dict()
    for k in moved:  # Polyak: a small step towards the online critic, not a copy
        assert not torch.equal(algorithm.qf1_target.state_dict()[k], online[k])


def test_replay_holds_float_actions_of_the_box_shape():
    algorithm = make_sac(overrides=("sac.learning_starts=0",))
    r = rollout(algorithm, seed=8, steps=16)[0]
    algorithm.observe(r, policy_lag=0)
    assert algorithm.replay.actions.dtype == np.float32 and algorithm.replay.actions.shape[1:] == (2,)
    np.testing.assert_array_equal(algorithm.replay.actions[:32], r.actions.reshape(32, 2))
    batch = algorithm.replay.sample(8)
    assert batch.actions.shape == (8, 2) and batch.actions.dtype == np.float32


# ---- config, spaces and saved policies ---------------------------------------------------------------


def test_sac_refuses_discrete_and_unbounded_action_spaces_and_sync():
    section = C.ALGORITHMS["sac"]
    with pytest.raises(C.ConfigError, match=r"needs a Box \(continuous\) action space.*use ppo or dqn"):
        section.check_spaces(describe("CartPole-v1"))
    with pytest.raises(
        C.ConfigError, match="scales its tanh-squashed actions to the action space's bounds and needs finite ones"
    ):
        section.check_spaces(describe("tests.tiny_envs:unbounded"))
    section.check_spaces(describe(BOUNDS))
    with pytest.raises(C.ConfigError, match="algo 'sac' cannot run in --mode sync.*off-policy"):
        section.check_mode("sync")
    with pytest.raises(C.ConfigError, match=r"sac.tau must be in \(0, 1\]"):
        C.build("pendulum-sac", ["sac.tau=0"])
    with pytest.raises(C.ConfigError, match="sac.policy_frequency must be at least 1"):
        C.build("pendulum-sac", ["sac.policy_frequency=0"])


def test_a_saved_sac_policy_loads_for_its_env_and_is_refused_by_another():
    spec = describe("Pendulum-v1")
    policy = SquashedGaussianPolicy(spec, C.PolicyConfig())
    state = {k: v.clone() for k, v in policy.state_dict().items()}
    assert "action_scale" not in state  # the bounds come from the env, not the file
    loaded = load_network("sac", spec, C.PolicyConfig(), state)
    assert all(torch.equal(state[k], v) for k, v in loaded.state_dict().items())
    with pytest.raises(PolicyMismatch, match="it acts with 1-dimensional continuous actions, the env takes 2 discrete"):
        load_network("sac", describe("CartPole-v1"), C.PolicyConfig(), state)
    with pytest.raises(PolicyMismatch, match="it takes observations of size 3, the env's have size 2"):
        load_network("sac", describe(BOUNDS), C.PolicyConfig(), state)

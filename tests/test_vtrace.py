"""V-trace (rlfarm.algos.ppo.appo.vtrace) against numbers worked out by hand on a 5-step trajectory of one
env: an episode that terminates at t=1, one truncated at t=3 (bootstrapped from its real final
observation's value, 5.0), and one cut by the end of the task at t=4 (bootstrapped from 7.0)."""

from __future__ import annotations

import numpy as np
import pytest

from rlfarm.algos.ppo.appo import vtrace

GAMMA = 0.9
REWARDS = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
VALUES = np.array([[0.5], [1.0], [1.5], [2.0], [2.5]])
DONES = np.array([[False], [True], [False], [True], [False]])
FINAL_VALUES = np.array([[0.0], [0.0], [0.0], [5.0], [0.0]])  # t=1 terminated: 0; t=3 truncated: V(final)
LAST_VALUES = np.array([7.0])
MU = np.log(np.array([[0.4], [0.6], [0.5], [0.2], [0.8]]))  # behaviour probabilities of the actions taken
RATIOS = np.array([[2.0], [0.5], [1.0], [3.0], [0.25]])  # pi / mu
PI = MU + np.log(RATIOS)


def run(target=PI, **kwargs):
    return vtrace(MU, target, REWARDS, VALUES, DONES, FINAL_VALUES, LAST_VALUES, GAMMA, **kwargs)


def test_vtrace_targets_and_advantages_by_hand():
    vs, adv, ratios = run(rho_bar=1.0, c_bar=1.0)
    np.testing.assert_allclose(ratios, RATIOS)
    # rho = c = min(1, pi/mu) = [1, .5, 1, 1, .25]
    # delta_t = rho_t (r_t + g V_next - V_t), V_next: V1, 0 (terminated), V3, 5 (truncated), 7 (task end)
    # d0 = 1.4, d1 = .5 (2 - 1), d2 = 3 + 1.8 - 1.5 = 3.3, d3 = 4 + 4.5 - 2 = 6.5, d4 = .25 (5 + 6.3 - 2.5) = 2.2
    # vs4 = 2.5 + 2.2; vs3 = 2 + 6.5; vs2 = 1.5 + 3.3 + .9 * 1 * 6.5; vs1 = 1 + .5; vs0 = .5 + 1.4 + .9 * 1 * .5
    np.testing.assert_allclose(vs[:, 0], [2.35, 1.5, 10.65, 8.5, 4.7], rtol=1e-6)
    # adv_t = rho_t (r_t + g vs_next - V_t), vs_next: vs1, 0, vs3, 5, 7
    np.testing.assert_allclose(adv[:, 0], [1.85, 0.5, 9.15, 6.5, 2.2], rtol=1e-6)


def test_rho_bar_truncates_the_weights():
    vs, adv, _ = run(rho_bar=0.5, c_bar=1.0)  # rho = [.5, .5, .5, .5, .25]
    # d3 = .5 * 6.5 = 3.25 -> vs3 = 5.25; adv3 = .5 * (4 + 4.5 - 2) = 3.25
    assert vs[3, 0] == pytest.approx(5.25) and adv[3, 0] == pytest.approx(3.25)
    # c_bar = 1 keeps c0 = 1: vs0 = .5 + .5 * 1.4 + .9 * 1 * (vs1 - 1), vs1 = 1 + .5 * .5 * 2 ... by hand:
    # d1 = .5 * (2 - 1) = .5 -> vs1 = 1.5; d0 = .5 * 1.4 = .7 -> vs0 = .5 + .7 + .9 * .5 = 1.65
    assert vs[0, 0] == pytest.approx(1.65)


def test_on_policy_with_unit_weights_is_the_n_step_return():
    vs, adv, ratios = run(target=MU, rho_bar=1.0, c_bar=1.0, lam=1.0)
    assert np.all(ratios == 1.0)
    # discounted rewards to the end of each piece, plus the bootstrap where it was cut
    np.testing.assert_allclose(vs[:, 0], [1 + 0.9 * 2, 2, 3 + 0.9 * (4 + 0.9 * 5), 4 + 0.9 * 5, 5 + 0.9 * 7], rtol=1e-6)
    # and the advantage is the one-step TD error towards those targets
    np.testing.assert_allclose(
        adv[:, 0], [1 + 0.9 * 2 - 0.5, 2 - 1, 3 + 0.9 * 8.5 - 1.5, 4 + 4.5 - 2, 5 + 6.3 - 2.5], rtol=1e-6
    )


def test_envs_are_independent_columns():
    two = lambda a: np.concatenate([a, a[::-1] * 0 + a], axis=1)  # noqa: E731 - the same env twice
    vs, adv, _ = vtrace(
        two(MU), two(PI), two(REWARDS), two(VALUES), two(DONES), two(FINAL_VALUES), np.array([7.0, 7.0]), GAMMA
    )
    np.testing.assert_allclose(vs[:, 0], vs[:, 1])
    np.testing.assert_allclose(adv[:, 0], [1.85, 0.5, 9.15, 6.5, 2.2], rtol=1e-6)


# ---- APPO's one pass (update_epochs = 1) -----------------------------------------------------------


def _lagged_rollout(spec, T: int, N: int, seed: int):
    """A batch acted by an older policy: behaviour log-probabilities a little off the learner's."""
    from rlfarm.core.rollout import Rollout

    rng = np.random.default_rng(seed)
    shape = (T, N, *spec.obs_shape)
    obs = (
        rng.integers(0, 256, shape, dtype=np.uint8)
        if spec.obs_dtype == "uint8"
        else rng.standard_normal(shape).astype(np.float32)
    )
    z = np.zeros((T, N), np.float32)
    return Rollout(
        obs=obs,
        actions=rng.integers(0, spec.action_dim, (T, N)),
        logprobs=(-np.log(spec.action_dim) + 0.1 * rng.standard_normal((T, N))).astype(np.float32),
        values=z.copy(),
        rewards=rng.choice([-1.0, 0.0, 1.0], (T, N)).astype(np.float32),
        dones=rng.random((T, N)) < 0.05,
        final_values=z.copy(),
        last_values=np.zeros(N, np.float32),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        last_obs=obs[-1].copy(),
    )


@pytest.mark.parametrize("env_id", ["CartPole-v1", "tests.tiny_envs:image"])
def test_one_pass_is_the_two_pass_update_when_the_network_cannot_move_in_between(env_id):
    """With one minibatch, V-trace's targets from the loss's own forward (one pass) are the targets of
    a separate forward first (two passes): the same gradient step, the same weights after it."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.appo import APPO
    from rlfarm.envs import describe

    spec = describe(env_id)
    cfg = C.build("cartpole-appo", [f"env.id={env_id}", "ppo.update_epochs=1", "ppo.num_minibatches=1"])
    rollout = _lagged_rollout(spec, T=16, N=4, seed=0)
    weights = []
    for path in ("_learn_in_one_pass", "_learn_after_targets"):
        torch.manual_seed(0)
        learner = APPO(cfg, spec, torch.device("cpu"))
        assert learner._one_pass(rollout)
        metrics, ratios = getattr(learner, path)(rollout, None)
        assert np.isfinite(metrics["losses/policy_loss"]) and ratios.size == 64
        weights.append(learner.state())
    one, two = weights
    for key in one:
        torch.testing.assert_close(one[key], two[key], rtol=1e-4, atol=1e-6)


def test_chunks_of_time_taken_from_the_last_give_the_targets_of_the_whole():
    """V-trace over T steps equals V-trace over its chunks, the last computed first, each earlier one
    bootstrapping from the next chunk's first values and continuing its recursion (`carry`)."""
    rng = np.random.default_rng(7)
    T, N = 12, 3
    behaviour = -np.log(2) + 0.3 * rng.standard_normal((T, N))
    target = -np.log(2) + 0.3 * rng.standard_normal((T, N))
    rewards = rng.standard_normal((T, N))
    values = rng.standard_normal((T, N))
    dones = rng.random((T, N)) < 0.2
    final = np.where(rng.random((T, N)) < 0.5, 0.0, rng.standard_normal((T, N)))
    last = rng.standard_normal(N)
    args = dict(gamma=0.97, rho_bar=1.0, c_bar=0.9, lam=0.95)
    whole_vs, whole_adv, _ = vtrace(behaviour, target, rewards, values, dones, final, last, **args)
    boot, carry, parts = last, np.zeros(N), []
    for start in (8, 4, 0):
        rows = slice(start, start + 4)
        vs, adv, _ = vtrace(
            behaviour[rows],
            target[rows],
            rewards[rows],
            values[rows],
            dones[rows],
            final[rows],
            boot,
            carry=carry,
            **args,
        )
        parts.insert(0, (vs, adv))
        boot, carry = values[start], vs[0] - values[start]
    np.testing.assert_allclose(np.concatenate([p[0] for p in parts]), whole_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), whole_adv, rtol=1e-5, atol=1e-5)


def test_one_pass_learns_in_chunks_of_time():
    """Several minibatches, each a chunk of time across every env: every weight that should move
    moves, the ratios are reported for every sample, and a batch whose steps do not divide into the
    minibatches takes the two-pass path."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.appo import APPO
    from rlfarm.envs import describe

    spec = describe("CartPole-v1")
    cfg = C.build("cartpole-appo", ["ppo.update_epochs=1", "ppo.num_minibatches=4"])
    torch.manual_seed(0)
    learner = APPO(cfg, spec, torch.device("cpu"))
    before = {k: v.clone() for k, v in learner.state().items()}
    rollout = _lagged_rollout(spec, T=16, N=8, seed=1)
    learner.observe(rollout, 2)
    while not learner.ready():
        learner.observe(_lagged_rollout(spec, T=16, N=8, seed=2), 2)
    metrics = learner.update(0.0)
    assert 0 < metrics["vtrace/rho_mean"] <= 1 and metrics["vtrace/policy_lag_mean"] == 2
    after = learner.state()
    assert any(not torch.equal(before[k], after[k]) for k in before if "actor" in k)
    assert not learner._one_pass(_lagged_rollout(spec, T=18, N=8, seed=3))  # 18 steps, 4 minibatches


@pytest.mark.parametrize("path", ["_learn_after_targets", "_learn_in_one_pass"])
def test_clipped_around_the_proximal_policy_a_lagged_batch_starts_unclipped(path):
    """clip_to = "proximal" (decoupled PPO): the ratio is taken to the network as the update begins,
    so however far the behaviour policy lags, a step starts inside the trust region, and its
    gradient is IMPALA's, -log pi(a) x V-trace's advantage (which carries min(rho_bar, pi/mu)); clipped
    around the lagged behaviour instead, most of the same batch starts clipped."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.appo import APPO
    from rlfarm.envs import describe

    spec = describe("CartPole-v1")
    rollout = _lagged_rollout(spec, T=16, N=4, seed=4)
    rollout.logprobs += np.random.default_rng(5).normal(0.0, 0.5, rollout.logprobs.shape).astype(np.float32)
    results = {}
    for name, overrides in {
        "proximal": ["ppo.clip_to=proximal"],
        "behaviour": ["ppo.clip_to=behaviour"],
        "impala": ["ppo.pg_loss=impala"],
    }.items():
        cfg = C.build("cartpole-appo", ["ppo.update_epochs=1", "ppo.num_minibatches=1", *overrides])
        torch.manual_seed(0)
        learner = APPO(cfg, spec, torch.device("cpu"))
        metrics, _ = getattr(learner, path)(rollout, None)
        results[name] = metrics["losses/clipfrac"], learner.state()
    assert results["proximal"][0] == 0.0
    assert results["behaviour"][0] > 0.5
    proximal, impala, behaviour = results["proximal"][1], results["impala"][1], results["behaviour"][1]
    for key in proximal:
        torch.testing.assert_close(proximal[key], impala[key], rtol=1e-4, atol=1e-6)
    assert any(not torch.allclose(proximal[k], behaviour[k]) for k in proximal if "actor" in k)


def test_clip_to_is_checked():
    from rlfarm import config as C

    with pytest.raises(C.ConfigError, match="ppo.clip_to must be behaviour, proximal or target, got 'targt'"):
        C.build("cartpole-appo", ["ppo.clip_to=targt"])
    assert C.build("cartpole-appo", ["ppo.clip_to=target"]).ppo.clip_to == "target"
    with pytest.raises(C.ConfigError, match="ppo.clip_to = target is an ASYNC"):
        C.build("cartpole-ppo", ["ppo.clip_to=target"])
    for key in (
        "ppo.is_ratio_clip=0",
        "ppo.adam_eps=0",
        "ppo.target_update_batches=0",
        "policy.obs_scale=0",
        "policy.cnn_padding=full",
        "policy.init=normal",
    ):
        with pytest.raises(C.ConfigError, match=key.split("=")[0]):
            C.build("cartpole-appo", [key])
    # the smallest accepted values (the bounds are "positive" and "at least 1")
    C.build("cartpole-appo", ["ppo.is_ratio_clip=1e-9", "ppo.adam_eps=1e-12", "ppo.target_update_batches=1"])
    C.build("cartpole-appo", ["policy.obs_scale=1e-9", "policy.cnn_padding=same", "policy.init=xavier"])

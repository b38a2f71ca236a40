"""Replay: n-step transitions by hand, ring buffer, prioritized sampling frequencies and weights."""

import numpy as np
import pytest

from rlfarm.core.replay import PrioritizedReplayBuffer, ReplayBuffer, SumTree, Transitions, nstep_transitions
from rlfarm.core.rollout import collect
from rlfarm.envs import make_vector_env

from .conftest import CountValue


def _rollout(env, steps):
    return collect(CountValue(), make_vector_env(f"tests.tiny_envs:{env}", 1), steps, [0], 0, keep_next_obs=True)


def test_next_obs_is_the_real_final_observation():
    r = _rollout("truncating", 4)
    assert r.next_obs[:, 0, 0].tolist() == [1, 2, 3, 1]  # 3: final obs, not the reset obs 0
    assert r.terminations.sum() == 0
    r = _rollout("terminating", 4)
    assert r.next_obs[:, 0, 0].tolist() == [1, 2, 3, 1] and r.terminations[:, 0].tolist() == [0, 0, 1, 0]


def test_nstep_on_truncation_bootstraps_from_final_obs():
    t = nstep_transitions(_rollout("truncating", 4), n=2, gamma=0.5)
    np.testing.assert_allclose(t.rewards, [1.5, 1.5, 1.0, 1.0])
    np.testing.assert_allclose(t.next_obs[:, 0], [2, 3, 3, 1])
    np.testing.assert_allclose(t.discounts, [0.25, 0.25, 0.5, 0.5])
    assert t.dones.tolist() == [False] * 4  # truncation is not termination


def test_nstep_stops_at_termination():
    t = nstep_transitions(_rollout("terminating", 4), n=3, gamma=0.5)
    np.testing.assert_allclose(t.rewards, [1.75, 1.5, 1.0, 1.0])
    np.testing.assert_allclose(t.discounts, [0.125, 0.25, 0.5, 0.5])
    assert t.dones.tolist() == [True, True, True, False]
    np.testing.assert_allclose(t.next_obs[:, 0], [3, 3, 3, 1])
    one = nstep_transitions(_rollout("terminating", 4), n=1, gamma=0.5)
    np.testing.assert_allclose(one.rewards, [1, 1, 1, 1])
    assert one.dones.tolist() == [False, False, True, False]


def _transitions(values):
    n = len(values)
    v = np.asarray(values, np.float32)
    return Transitions(v[:, None], np.arange(n), v, v[:, None], np.zeros(n, bool), np.ones(n, np.float32))


def test_ring_buffer_overwrites_oldest():
    buf = ReplayBuffer(4, obs_shape=1)
    buf.add(_transitions([0, 1, 2]))
    buf.add(_transitions([3, 4]))
    assert len(buf) == 4 and sorted(buf.rewards.tolist()) == [1, 2, 3, 4]
    batch = buf.sample(1000)
    assert set(batch.rewards.tolist()) == {1, 2, 3, 4} and (batch.weights == 1).all()


def test_sum_tree_sums_and_finds():
    tree = SumTree(5)
    tree.set(np.arange(5), np.array([1.0, 2, 3, 4, 0]))
    assert tree.total == 10
    np.testing.assert_array_equal(tree.find(np.array([0.5, 1.5, 3.5, 6.5, 9.99])), [0, 1, 2, 3, 3])


def test_prioritized_sampling_follows_priorities_and_weights_are_correct():
    buf = PrioritizedReplayBuffer(4, obs_shape=1, alpha=1.0, eps=0.0, seed=0)
    slots = buf.add(_transitions([0, 1, 2, 3]))
    buf.update_priorities(slots, np.array([1.0, 2.0, 3.0, 4.0]))  # P = 0.1, 0.2, 0.3, 0.4
    counts = np.zeros(4)
    for _ in range(200):
        batch = buf.sample(500, beta=1.0)
        counts += np.bincount(batch.indices, minlength=4)
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.005)
    # w_i = (N P_i)^-beta / max_j w_j = (0.4, 0.8, 1.2, 1.6)^-1 / 2.5 = 1, 1/2, 1/3, 1/4
    batch = buf.sample(500, beta=1.0)
    expected = {0: 1.0, 1: 0.5, 2: 1 / 3, 3: 0.25}
    for i, w in zip(batch.indices, batch.weights):
        assert w == pytest.approx(expected[i], rel=1e-6)
    # beta = 0.5: w_i proportional to (N P_i)^-0.5
    batch = buf.sample(500, beta=0.5)
    ref = (4 * np.array([0.1, 0.2, 0.3, 0.4])) ** -0.5
    np.testing.assert_allclose(batch.weights, ref[batch.indices] / ref[batch.indices].max(), rtol=1e-6)


def test_new_transitions_get_max_priority_and_alpha_applies():
    buf = PrioritizedReplayBuffer(8, obs_shape=1, alpha=0.5, eps=0.0)
    slots = buf.add(_transitions([0, 1]))
    buf.update_priorities(slots, np.array([4.0, 9.0]))
    new = buf.add(_transitions([2]))
    np.testing.assert_allclose(buf.tree.get(np.r_[slots, new]), [2.0, 3.0, 3.0])  # sqrt(9) for the new one


def test_dqn_gradient_clip_matches_torch():
    import torch

    from rlfarm.algos.dqn.dqn import clip_grad_norm

    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 8), torch.nn.Linear(4, 8)
    b.load_state_dict(a.state_dict())
    x = torch.randn(16, 4) * 100
    for max_norm in (0.5, 1e6):  # clipped, and left alone
        for net in (a, b):
            net.zero_grad()
            net(x).pow(2).sum().backward()
        expected = torch.nn.utils.clip_grad_norm_(a.parameters(), max_norm)
        got = clip_grad_norm(list(b.parameters()), max_norm)
        assert torch.allclose(got, expected)
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.allclose(pa.grad, pb.grad, rtol=1e-5)

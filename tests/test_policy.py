"""Networks and acting: numpy snapshot agrees with torch; sampling follows the distribution."""

import numpy as np
import torch

from rlfarm.config import PolicyConfig
from rlfarm.envs import describe
from rlfarm.policy import build_policy


def test_numpy_actor_matches_torch_logprob_and_value():
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        torch.manual_seed(0)
        policy = build_policy(describe(env_id), PolicyConfig())
        actor = policy.actor_snapshot()
        obs = np.random.default_rng(0).normal(size=(64, policy.spec.obs_dim)).astype(np.float32)
        actions, logprob, value = actor.act(obs, np.random.default_rng(1))
        t_logprob, _, t_value = policy.evaluate(torch.as_tensor(obs), torch.as_tensor(actions))
        np.testing.assert_allclose(logprob, t_logprob.detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(value, t_value.detach().numpy(), atol=1e-5)


def test_categorical_sampling_follows_probabilities():
    torch.manual_seed(0)
    policy = build_policy(describe("CartPole-v1"), PolicyConfig())
    with torch.no_grad():  # make the policy strongly prefer action 1: p = sigmoid(1) = 0.731
        policy.actor[-1].weight.zero_()
        policy.actor[-1].bias.copy_(torch.tensor([0.0, 1.0]))
    actor = policy.actor_snapshot()
    obs = np.zeros((20000, 4), np.float32)
    actions, logprob, _ = actor.act(obs, np.random.default_rng(0))
    p1 = 1 / (1 + np.exp(-1.0))
    assert abs(actions.mean() - p1) < 0.01  # 20k samples: std error 0.003
    np.testing.assert_allclose(logprob[actions == 1], np.log(p1), rtol=1e-5)
    greedy, _, _ = actor.act(obs[:5], np.random.default_rng(0), deterministic=True)
    assert greedy.tolist() == [1] * 5


def test_gaussian_sampling_uses_log_std():
    torch.manual_seed(0)
    policy = build_policy(describe("Pendulum-v1"), PolicyConfig(init_log_std=-1.0))
    actor = policy.actor_snapshot()
    obs = np.zeros((20000, 3), np.float32)
    actions, _, _ = actor.act(obs, np.random.default_rng(0))
    mean, _, _ = actor.act(obs[:1], np.random.default_rng(0), deterministic=True)
    assert abs((actions - mean).std() - np.exp(-1.0)) < 0.01

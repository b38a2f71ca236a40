"""Observation normalisation that travels with the policy: the statistics a worker acts with are
exactly the learner's for that version, they are updated by the learner only, and they survive a
checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.core import codec
from rlfarm.core.rollout import collect
from rlfarm.envs import describe, make_vector_env
from rlfarm.nn.normalize import combine


def test_running_statistics_equal_the_statistics_of_everything_seen():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (n, 3)) for n in (1, 7, 50, 2)]
    mean, var, count = np.zeros(3), np.ones(3), 0.0
    for b in batches:
        mean, var, count = combine(mean, var, count, b)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var, everything.var(0), rtol=1e-12)
    assert count == len(everything)


def make_ppo(mode: str = "sync", seed: int = 0):
    cfg = C.build(
        None,
        [
            f"mode={mode}",
            "env.id=Pendulum-v1",
            "env.num_envs=2",
            "farm.num_tasks=1",
            "farm.steps_per_env=64",
            "ppo.num_minibatches=2",
            "ppo.update_epochs=2",
            "policy.normalize_obs=true",
            "policy.hidden_sizes=[32,32]",
        ],
        seed=seed,
    )
    torch.manual_seed(seed)
    spec = describe("Pendulum-v1")
    return learner("ppo", mode)(cfg, spec, torch.device("cpu")), spec


def scaled_rollout(algorithm, seed: int):
    """A real Pendulum rollout, acted by the algorithm's own actor, with observations moved far from
    (0, 1) statistics (Pendulum's angular velocity is already up to 8)."""
    actor = type(algorithm).actor_snapshot(algorithm.policy)
    r = collect(actor, make_vector_env("Pendulum-v1", 2), 64, [seed, seed + 1], seed)
    r.obs = r.obs * 5.0 + 20.0
    r.last_obs = r.last_obs * 5.0 + 20.0
    return r


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_acts_with_exactly_the_learners_statistics_for_a_version(mode):
    algorithm, spec = make_ppo(mode)
    for seed in (1, 2):
        algorithm.observe(scaled_rollout(algorithm, seed), policy_lag=0)
        while algorithm.ready():
            algorithm.update(0.5)
    norm = algorithm.policy.obs_norm
    assert norm.count.item() == 2 * 128 and norm.mean.mean().item() > 15  # the learner updated them

    # What a worker does with a published version: decode the blob, build the network, take its actor.
    blob = codec.encode_policy(algorithm.state(), {"version": "3", "algo": "ppo"})
    state, _ = codec.decode_policy(blob)
    network = learner("ppo").build_network(spec, C.policy_config(C.to_dict(algorithm.run_config)["policy"]))
    network.load_state_dict(state)
    worker_actor = learner("ppo").actor_snapshot(network)

    obs = np.random.default_rng(7).normal(20.0, 5.0, (16, spec.obs_dim)).astype(np.float32)
    action, _, value = worker_actor.act(obs, np.random.default_rng(0), deterministic=True)
    with torch.no_grad():
        mean = algorithm.policy.actor(algorithm.policy._features(torch.from_numpy(obs))).numpy()
        learner_value = algorithm.policy.get_value(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(action, mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, learner_value, rtol=1e-5, atol=1e-5)
    # and the statistics are applied, not bypassed: raw observations would give other outputs
    raw = algorithm.policy.actor(torch.from_numpy(obs)).detach().numpy()
    assert not np.allclose(raw, mean, atol=1e-3)


def test_statistics_survive_a_checkpoint_and_keep_updating_identically():
    whole, _ = make_ppo()
    whole.observe(scaled_rollout(whole, 1), 0)
    whole.update(0.1)
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}
    second = scaled_rollout(whole, 2)
    whole.observe(second, 0)
    whole.update(0.2)

    resumed, _ = make_ppo(seed=42)
    resumed.restore(tensors, state)
    resumed.observe(second, 0)
    resumed.update(0.2)
    a, b = whole.state(), resumed.state()
    assert "obs_norm.mean" in a and all(torch.equal(a[k], b[k]) for k in a)


def test_sac_workers_act_with_the_learners_statistics_and_critics_see_them_too():
    cfg = C.build(
        None,
        [
            "algo=sac",
            "mode=async",
            "env.id=Pendulum-v1",
            "env.num_envs=1",
            "farm.steps_per_env=64",
            "policy.normalize_obs=true",
            "policy.hidden_sizes=[32,32]",
            "sac.learning_starts=0",
            "sac.batch_size=32",
            "sac.buffer_size=1000",
            "sac.replay_ratio=0.1",
        ],
    )
    spec = describe("Pendulum-v1")
    algorithm = learner("sac", "async")(cfg, spec, torch.device("cpu"))
    r = collect(
        type(algorithm).actor_snapshot(algorithm.policy),
        make_vector_env("Pendulum-v1", 1),
        64,
        [1],
        1,
        keep_next_obs=True,
    )
    r.obs, r.next_obs = r.obs * 5.0 + 20.0, r.next_obs * 5.0 + 20.0
    algorithm.observe(r, 0)
    while algorithm.ready():
        algorithm.update(0.5)
    assert algorithm.policy.obs_norm.count.item() == 64 and algorithm.policy.obs_norm.mean.mean().item() > 15

    state, _ = codec.decode_policy(codec.encode_policy(algorithm.state(), {"version": "1", "algo": "sac"}))
    network = learner("sac").build_network(spec, C.policy_config(C.to_dict(cfg)["policy"]))
    network.load_state_dict(state)
    obs = np.random.default_rng(3).normal(20.0, 5.0, (8, spec.obs_dim)).astype(np.float32)
    action, _, _ = learner("sac").actor_snapshot(network).act(obs, np.random.default_rng(0), deterministic=True)
    with torch.no_grad():
        greedy = algorithm.policy.to_env(algorithm.policy.greedy(torch.from_numpy(obs))).numpy()
    np.testing.assert_allclose(action, greedy, rtol=1e-5, atol=1e-5)

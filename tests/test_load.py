"""`rlfarm.load(path)`: every algorithm's policy file acts like a Stable-Baselines3 model,
`action, _ = policy.predict(obs, deterministic=True)`, for one observation and for a batch.

Freshly initialised networks are saved as the trainer saves them (the published version's
metadata, `describe_policy`, then best_policy.safetensors' additions: rlfarm.trainer.base), so no
training is needed; the actions are compared with what each network's own torch forward picks.
Files of real runs are loaded by tests/test_api.py and tests/test_evaluation.py (farm tier)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import rlfarm
from rlfarm import config as C
from rlfarm.algos import network_for
from rlfarm.algos.saved import describe_policy
from rlfarm.core import codec
from rlfarm.envs import describe, make_env

DATA = Path(__file__).parent / "data"


def save_fresh(
    path: Path, preset: str, env_id: str | None = None, sets: tuple[str, ...] = (), dtype: str = "float32"
) -> torch.nn.Module:
    """A freshly initialised network of `preset`, written to `path` with the metadata the trainer
    gives a version (Trainer.publish) and best_policy.safetensors (Trainer._write_best)."""
    cfg = C.build(preset, list(sets), **({"env.id": env_id} if env_id else {}))
    spec = describe(cfg.env.id, C.to_dict(cfg)["env"])
    torch.manual_seed(1)
    network = network_for(cfg.algo, spec, cfg.policy)  # a group of networks for several policies
    meta = {
        "version": "3",
        "algo": cfg.algo,
        "run": "fresh",
        "env_steps": "0",
        **describe_policy(cfg.algo, spec),
        "env": cfg.env.id,
        "policy": json.dumps(C.to_dict(cfg)["policy"]),
        "env_options": json.dumps(C.to_dict(cfg)["env"]),
        "eval_mean_return": "1.000",
    }
    path.write_bytes(codec.encode_policy(codec.wire_state(network.state_dict(), dtype), meta))
    return network.eval()


@torch.no_grad()
def greedy(algo: str, network: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    """The network's own greedy actions for a batch, computed in torch."""
    x = torch.as_tensor(obs)
    if algo == "ppo":
        dist = network.distribution(x)
        if network.spec.discrete:
            return dist.logits.argmax(-1).numpy()
        return np.clip(dist.mean.numpy(), network.spec.action_low, network.spec.action_high)
    if algo == "dqn":
        return network(x).argmax(-1).numpy()
    if algo == "sac":
        return network.to_env(network.greedy(x)).numpy()
    return network.to_env(network(x)).numpy()  # td3


CASES = [
    ("ppo", "cartpole-ppo", None),
    ("ppo", "pendulum-ppo", None),
    ("dqn", "cartpole-dqn", None),
    ("sac", "pendulum-sac", None),
    ("td3", "pendulum-td3", None),
    ("ppo", "cartpole-ppo", "tests.tiny_envs:image"),  # a CNN on uint8 images
    ("dqn", "cartpole-dqn", "tests.tiny_envs:image"),
]


def observations(env_id: str, n: int) -> np.ndarray:
    env = make_env(env_id, trusted=True)
    env.observation_space.seed(0)
    obs = np.stack([env.observation_space.sample() for _ in range(n)])
    env.close()
    return obs


@pytest.mark.parametrize("algo, preset, env_id", CASES, ids=[f"{a}-{e or p}" for a, p, e in CASES])
def test_predict_is_the_networks_greedy_action_for_one_observation_and_a_batch(tmp_path, algo, preset, env_id):
    path = tmp_path / "best_policy.safetensors"
    network = save_fresh(path, preset, env_id)
    policy = rlfarm.load(path)
    assert isinstance(policy, rlfarm.LoadedPolicy) and policy.algo == algo and policy.version == "3"
    env = policy.make_env(env_id=env_id)  # a module's env is made only when named by the user
    obs = observations(env_id or env.spec.id, 16)
    expected = greedy(algo, network, obs)

    actions, state = policy.predict(obs, deterministic=True)
    assert state is None
    assert actions.shape == (16, *network.spec.action_shape)
    if network.spec.discrete:
        np.testing.assert_array_equal(actions, expected)
    else:
        np.testing.assert_allclose(actions, expected, rtol=1e-4, atol=1e-5)

    one, _ = policy.predict(obs[0])  # deterministic=True is the default, as in SB3
    assert np.shape(one) == network.spec.action_shape
    np.testing.assert_allclose(one, actions[0], rtol=1e-5, atol=1e-6)
    assert env.action_space.contains(np.asarray(one, env.action_space.dtype))
    env.close()


@pytest.mark.parametrize("preset", ["cartpole-ppo", "pendulum-ppo", "pendulum-sac"])
def test_deterministic_false_samples_and_a_seed_repeats_the_samples(tmp_path, preset):
    path = tmp_path / "p.safetensors"
    save_fresh(path, preset)
    policy = rlfarm.load(path, seed=7)
    obs = np.repeat(observations(policy.env_id, 1), 256, axis=0)
    sampled, _ = policy.predict(obs, deterministic=False)
    greedy_actions, _ = policy.predict(obs, deterministic=True)
    # One observation, one greedy action (up to float rounding, which differs by row in a batch);
    # sampled, the policy's distribution shows.
    assert np.allclose(greedy_actions, greedy_actions[0], atol=1e-6)
    assert not np.allclose(sampled, sampled[0], atol=1e-3)
    again, _ = rlfarm.load(path, seed=7).predict(obs, deterministic=False)
    np.testing.assert_array_equal(sampled, again)


def test_dqn_and_td3_explore_with_the_acting_option_given(tmp_path):
    save_fresh(tmp_path / "dqn.safetensors", "cartpole-dqn")
    save_fresh(tmp_path / "td3.safetensors", "pendulum-td3")
    obs = np.zeros((256, 4), np.float32)
    greedy_dqn, _ = rlfarm.load(tmp_path / "dqn.safetensors").predict(obs, deterministic=False)
    assert len(np.unique(greedy_dqn)) == 1  # a Q-network has no distribution: greedy without epsilon
    explored, _ = rlfarm.load(tmp_path / "dqn.safetensors", epsilon=0.5, seed=0).predict(obs, deterministic=False)
    assert set(np.unique(explored)) == {0, 1}
    noisy, _ = rlfarm.load(tmp_path / "td3.safetensors", noise=0.3, seed=0).predict(
        np.zeros((64, 3), np.float32), deterministic=False
    )
    assert len(np.unique(noisy)) > 1 and (np.abs(noisy) <= 2.0).all()  # Pendulum's bounds
    with pytest.raises(rlfarm.PolicyFileError, match="QActor takes no acting options, got \\['noise'\\]"):
        rlfarm.load(tmp_path / "dqn.safetensors", noise=0.1)


def test_a_float16_policy_loads_and_a_policy_plays_its_env(tmp_path):
    """farm.policy_dtype = "float16" halves what a version carries; the loaded network is float32."""
    path = tmp_path / "p.safetensors"
    save_fresh(path, "cartpole-ppo", dtype="float16")
    policy = rlfarm.load(path)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    total, done = 0.0, False
    while not done:
        action, _ = policy.predict(obs)
        obs, reward, terminated, truncated, _ = env.step(action)
        total, done = total + reward, terminated or truncated
    assert 8 <= total <= 500


@pytest.mark.parametrize("algo", ["dqn", "sac", "ppo"])
def test_a_real_runs_policy_file_without_spaces_loads_from_the_env_it_names(algo):
    """best_policy.safetensors written by `rlfarm train` of an earlier release: no `space` in its
    metadata, so the env it names is made once to read the spaces."""
    policy = rlfarm.load(DATA / f"{algo}-best_policy-before-redesign.safetensors")
    env = policy.make_env()
    obs, _ = env.reset(seed=1)
    action, _ = policy.predict(obs)
    assert env.action_space.contains(np.asarray(action, env.action_space.dtype))
    batch, _ = policy.predict(np.stack([obs, obs, obs]))
    assert len(batch) == 3
    env.close()


def test_what_cannot_be_loaded_says_why(tmp_path):
    path = tmp_path / "p.safetensors"
    save_fresh(path, "cartpole-ppo")
    policy = rlfarm.load(path)
    with pytest.raises(
        ValueError,
        match=r"observation of shape \[3\] does not fit this policy: it takes one "
        r"observation of shape \[4\], or a batch of them \(shape \[N, 4\]\)",
    ):
        policy.predict(np.zeros(3))
    with pytest.raises(rlfarm.PolicyFileError, match="does not fit env Pendulum-v1: it takes observations of size 4"):
        rlfarm.load(path, env="Pendulum-v1")
    (tmp_path / "not-a-policy").write_bytes(b"hello")
    with pytest.raises(rlfarm.PolicyFileError, match="not-a-policy"):
        rlfarm.load(tmp_path / "not-a-policy")
    with pytest.raises(rlfarm.PolicyFileError, match="cannot read"):
        rlfarm.load(tmp_path / "missing.safetensors")


def test_an_atari_policy_plays_the_preprocessed_env_it_names(tmp_path):
    """pong's Nature CNN: make_env() applies the run's Atari preprocessing (from the file's env_options),
    so the env's frames are what the network takes."""
    pytest.importorskip("ale_py")
    path = tmp_path / "pong.safetensors"
    network = save_fresh(path, "pong")
    policy = rlfarm.load(path)
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    assert obs.shape == network.spec.obs_shape and obs.dtype == np.uint8
    action, _ = policy.predict(obs)
    assert action == greedy("ppo", network, obs[None])[0] and env.action_space.contains(action)
    env.close()

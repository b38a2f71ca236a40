"""Images with memory (policy.recurrent on image observations): the Nature CNN feeds the LSTM or GRU;
the ONNX Runtime and torch actors step as the network does and carry its state; the learner replays
exactly what the actor acted (its first ratio is 1); a loaded policy predicts with the state it returns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfarm.algos.ppo.policies import OnnxRecurrentActor, RecurrentActorCritic, TorchRecurrentActor
from rlfarm.config import PolicyConfig
from rlfarm.core.rollout import collect, concat
from rlfarm.envs import describe, make_env, make_vector_env
from rlfarm.errors import ConfigError
from rlfarm.nn.actors import onnx_installed

from .test_recurrent import assert_replayed_as_acted

pytestmark = pytest.mark.unit

IMAGE_ENV = "tests.tiny_envs:image"  # 2x16x16 uint8, CHW, 16-step episodes
RUNTIMES = ["torch", pytest.param("onnx", marks=pytest.mark.skipif(not onnx_installed(), reason="the atari extra"))]


def _policy(kind: str, env_id: str = IMAGE_ENV, seed: int = 0, **extra) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    config = PolicyConfig(recurrent=kind, recurrent_size=16, cnn_features=32, **extra)
    return RecurrentActorCritic(describe(env_id), config)


def _actor(policy: RecurrentActorCritic, runtime: str):
    if runtime == "torch":
        return TorchRecurrentActor(policy)
    actor = policy.actor_snapshot()  # ONNX Runtime where it is installed
    # A Gaussian policy acts with torch, as a feed-forward image one does: OnnxGraph refuses a network
    # whose actor_logstd the exported function does not use (it reads it outside the graph).
    assert isinstance(actor, OnnxRecurrentActor if policy.spec.discrete else TorchRecurrentActor)
    return actor


def test_an_image_policy_has_the_cnn_the_core_and_linear_heads():
    policy = _policy("lstm")
    assert policy.encoder is not None and policy.encoder.features == 32
    assert policy.memory.rnn.input_size == 32
    assert [type(m).__name__ for m in policy.actor] == ["Linear"] and policy.actor[0].in_features == 16
    assert [type(m).__name__ for m in policy.critic] == ["Linear"]


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(
    ("kind", "critic_core", "env_id"),
    [
        ("lstm", False, IMAGE_ENV),
        ("gru", False, IMAGE_ENV),
        ("lstm", True, IMAGE_ENV),
        ("gru", False, f"{IMAGE_ENV}_hwc"),
        ("lstm", False, f"{IMAGE_ENV}_box"),  # a Gaussian policy
    ],
)
def test_the_image_actor_steps_as_the_network_and_value_leaves_its_state_alone(runtime, kind, critic_core, env_id):
    """Six steps of four sub-envs with episode starts in between: the actor's values and state are the
    network's `step`s from the same state, zeroed where the episodes started."""
    policy = _policy(kind, env_id, critic_core=critic_core)
    actor = _actor(policy, runtime)
    rng = np.random.default_rng(3)
    actor.begin(4)
    state = torch.zeros(4, policy.state_size)
    for t in range(6):
        obs = rng.integers(0, 256, (4, *policy.spec.obs_shape), dtype=np.uint8)
        before = actor.state.copy()
        values = actor.value(obs)
        np.testing.assert_array_equal(actor.state, before)  # value peeks, it does not step
        rows = np.array([1, 3])
        np.testing.assert_allclose(actor.value(obs[rows], rows=rows), values[rows], atol=1e-6)
        _, _, value = actor.act(obs, rng)
        with torch.no_grad():
            _, torch_value, state = policy.step(torch.from_numpy(obs), state)
        np.testing.assert_allclose(value, torch_value.numpy(), atol=1e-5)
        np.testing.assert_allclose(values, value, atol=1e-6)
        np.testing.assert_allclose(actor.state, state.numpy(), atol=1e-5)
        if t == 2:  # episodes start anew in sub-envs 0 and 2
            starts = np.array([True, False, True, False])
            actor.episodes_started(starts)
            state[torch.from_numpy(starts)] = 0.0
            assert not actor.state[[0, 2]].any() and actor.state[[1, 3]].any()


def test_without_onnx_runtime_the_snapshot_is_torchs(monkeypatch):
    """RLFARM_ACTOR_RUNTIME=torch (or no atari extra): actor_snapshot acts with torch, as ActorCritic's."""
    monkeypatch.setenv("RLFARM_ACTOR_RUNTIME", "torch")
    assert isinstance(_policy("lstm").actor_snapshot(), TorchRecurrentActor)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_greedy_outputs_are_the_networks(runtime):
    """The actor head's output itself (not only the value): greedy actions are its argmax."""
    policy = _policy("gru", seed=2)
    actor = _actor(policy, runtime)
    rng = np.random.default_rng(0)
    actor.begin(8)
    state = torch.zeros(8, policy.state_size)
    for _ in range(3):
        obs = rng.integers(0, 256, (8, *policy.spec.obs_shape), dtype=np.uint8)
        out, _, _ = actor._step(obs, actor.state)
        action, _, _ = actor.act(obs, rng, deterministic=True)
        with torch.no_grad():
            torch_out, _, state = policy.step(torch.from_numpy(obs), state)
        np.testing.assert_allclose(out, torch_out.numpy(), atol=1e-5)
        np.testing.assert_array_equal(action, torch_out.numpy().argmax(-1))


@pytest.mark.parametrize("runtime", RUNTIMES)
@pytest.mark.parametrize(("kind", "seq_len", "critic_core"), [("lstm", 8, False), ("gru", 0, True)])
def test_the_learner_replays_each_image_sequence_as_the_actor_acted(runtime, kind, seq_len, critic_core):
    """16-step episodes start and end inside 40-step tasks and at sequences' edges; from the recorded
    start states, the learner's log-probabilities and values of the (L, B, C, H, W) uint8 sequences are
    the actor's, so PPO's first ratio is 1."""
    policy = _policy(kind, seq_len=seq_len, critic_core=critic_core)
    envs = make_vector_env(IMAGE_ENV, 3)
    tasks = []
    for index in range(2):
        actor = _actor(policy, runtime)
        tasks.append(collect(actor, envs, 40, [10 * index + i for i in range(3)], action_seed=index))
    rollout = concat(tasks)
    length = seq_len or 40
    assert rollout.obs.dtype == np.uint8 and rollout.states.shape == (40 // length, 6, policy.state_size)
    assert rollout.dones.sum() >= 6 and not rollout.states[0].any()  # fresh episodes: from zeros
    assert length == 40 or rollout.states[1:].any()  # later sequences start with a memory
    assert_replayed_as_acted(policy, rollout, length)


def test_the_ppo_learners_first_update_of_an_image_recurrent_policy_starts_at_ratio_1():
    """The learner itself (PPO._optimize_sequences, its network placed channels-last on the CPU): one
    epoch of one minibatch of what its own actor acted has an approx_kl of 0 and no clipped ratio."""
    from rlfarm import config as C
    from rlfarm.algos.ppo.ppo import PPO

    sets = [f"env.id={IMAGE_ENV}", "env.num_envs=2", "farm.steps_per_env=32", "farm.num_tasks=1"]
    sets += ["policy.recurrent=lstm", "policy.recurrent_size=16", "policy.cnn_features=32", "policy.seq_len=8"]
    sets += ["ppo.update_epochs=1", "ppo.num_minibatches=1"]
    cfg = C.build("cartpole-ppo", sets)
    torch.manual_seed(0)
    algo = PPO(cfg, describe(IMAGE_ENV), torch.device("cpu"))
    rollout = collect(algo.policy.actor_snapshot(), make_vector_env(IMAGE_ENV, 2), 32, [1, 2], action_seed=0)
    before = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    metrics = algo.train(rollout, progress_remaining=1.0)
    assert abs(metrics["losses/approx_kl"]) < 1e-6 and metrics["losses/clipfrac"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in algo.policy.state_dict().items())  # and it learned


def test_appos_targets_of_an_image_task_replay_what_its_actor_acted():
    """Recurrent APPO on images: V-trace's target log-probabilities, values and the value after the
    task, replayed from the recorded states by the learner's own network, are the actor's."""
    from rlfarm import config as C
    from rlfarm.algos.ppo.appo import APPO

    sets = [f"env.id={IMAGE_ENV}", "env.num_envs=2", "farm.steps_per_env=32", "mode=async"]
    sets += ["policy.recurrent=gru", "policy.recurrent_size=16", "policy.cnn_features=32", "policy.seq_len=8"]
    cfg = C.build("cartpole-ppo", sets)
    torch.manual_seed(0)
    algo = APPO(cfg, describe(IMAGE_ENV), torch.device("cpu"))
    rollout = collect(algo.policy.actor_snapshot(), make_vector_env(IMAGE_ENV, 2), 32, [3, 4], action_seed=0)
    assert rollout.dones[7::8].any()  # an episode (16 steps) ends where a sequence does
    logprobs, values, last_values = algo._evaluate(rollout)
    np.testing.assert_allclose(logprobs, rollout.logprobs, atol=2e-5)
    np.testing.assert_allclose(values, rollout.values, atol=2e-5)
    np.testing.assert_allclose(last_values, rollout.last_values, atol=2e-5)


def test_an_image_recurrent_config_is_accepted_and_several_policies_are_still_refused():
    from rlfarm import config as C
    from rlfarm.algos.ppo.ppo import PPO

    cfg = C.build("cartpole-ppo", [f"env.id={IMAGE_ENV}", "policy.recurrent=gru", "policy.seq_len=64"])
    assert isinstance(PPO.build_network(describe(IMAGE_ENV), cfg.policy), RecurrentActorCritic)
    with pytest.raises(ConfigError, match="several policies") as caught:
        C.build("cartpole-ppo", [f"env.id={IMAGE_ENV}", "policy.recurrent=lstm", "env.policy_map=['*=a']"])
    assert "\n" not in str(caught.value)
    two = describe("rlfarm/four_rooms_two_level", {"policy_map": ["upper=upper", "lower=lower"]})
    with pytest.raises(ConfigError, match="several policies"):
        RecurrentActorCritic(two, PolicyConfig(recurrent="lstm"))


def test_a_loaded_image_recurrent_policy_predicts_with_the_state_it_returns(tmp_path):
    """rlfarm.load(...).predict(obs, state, episode_start) for an image policy with memory, as for a
    vector one (tests/test_recurrent.py): its state is the network's, zeroed at episode starts."""
    import rlfarm
    from rlfarm import config as C
    from rlfarm.algos.ppo.ppo import PPO
    from rlfarm.trainer.summary import write_final_policy

    sets = [f"env.id={IMAGE_ENV}", "policy.recurrent=lstm", "policy.recurrent_size=8", "policy.cnn_features=32"]
    cfg = C.build("cartpole-ppo", sets)
    spec = describe(IMAGE_ENV)
    torch.manual_seed(0)
    network = PPO.build_network(spec, cfg.policy)
    path = write_final_policy(tmp_path, cfg, spec, network.state_dict(), 3, None)
    policy = rlfarm.load(path)
    env = make_env(IMAGE_ENV)
    obs, _ = env.reset(seed=0)
    state, start = None, np.ones(1, bool)
    torch_state = torch.zeros(1, network.state_size)
    ends = 0
    for _ in range(40):  # 16-step episodes: two starts within
        action, state = policy.predict(obs, state=state, episode_start=start, deterministic=True)
        with torch.no_grad():
            out, _, torch_state = network.step(torch.from_numpy(obs[None]), torch_state)
        assert action == int(out.argmax()) and state.shape == (1, network.state_size)
        np.testing.assert_allclose(state, torch_state.numpy(), atol=1e-5)
        obs, _, terminated, truncated, _ = env.step(action)
        start = np.array([terminated or truncated])
        if start[0]:
            obs, _ = env.reset()
            torch_state, ends = torch.zeros_like(torch_state), ends + 1
    assert ends >= 2
    _, fresh = policy.predict(obs, state=state, episode_start=np.ones(1, bool))
    _, carried = policy.predict(obs, state=state, episode_start=np.zeros(1, bool))
    assert not np.allclose(fresh, carried)

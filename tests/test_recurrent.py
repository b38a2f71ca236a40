"""Recurrent policies (policy.recurrent, issue 53), in one process: the numpy cells are torch's, an
actor carries its state and zeroes it where episodes start, a task records each sequence's start state,
and the learner's sequences replay exactly what the actor acted with (its first epoch's ratio is 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlfarm.algos.ppo.policies import RecurrentActorCritic
from rlfarm.algos.ppo.sequences import episode_starts, to_sequences
from rlfarm.config import PolicyConfig
from rlfarm.core.rollout import collect, concat, run_episodes
from rlfarm.envs import describe, make_env, make_vector_env
from rlfarm.nn.actors import numpy_state
from rlfarm.nn.memory import NumpyMemory
from rlfarm.nn.recurrent import RecurrentCore

pytestmark = pytest.mark.unit

ENV = "rlfarm/cartpole_no_vel"


def _policy(kind: str, seq_len: int = 0, seed: int = 0, **extra) -> RecurrentActorCritic:
    torch.manual_seed(seed)
    config = PolicyConfig(hidden_sizes=(32,), recurrent=kind, recurrent_size=16, seq_len=seq_len, **extra)
    return RecurrentActorCritic(describe(ENV), config)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_numpy_cell_is_torchs(kind):
    torch.manual_seed(1)
    core = RecurrentCore(kind, 5, 8)
    mine = NumpyMemory(numpy_state(core), "rnn", kind, 5, 8)
    rng = np.random.default_rng(0)
    state = rng.standard_normal((3, core.state_size)).astype(np.float32)
    for _ in range(4):
        x = rng.standard_normal((3, 5)).astype(np.float32)
        out, next_state = core.step(torch.from_numpy(x), torch.from_numpy(state))
        got, got_state = mine(x, state)
        np.testing.assert_allclose(got, out.detach().numpy(), atol=1e-6)
        np.testing.assert_allclose(got_state, next_state.detach().numpy(), atol=1e-6)
        state = got_state


@pytest.mark.parametrize(("kind", "critic_core"), [("lstm", False), ("gru", False), ("lstm", True)])
def test_the_actor_steps_as_the_network_and_value_leaves_its_state_alone(kind, critic_core):
    policy = _policy(kind, normalize_obs=True, critic_core=critic_core)
    actor = policy.actor_snapshot()
    rng = np.random.default_rng(3)
    actor.begin(4)
    state = torch.zeros(4, policy.state_size)
    for _ in range(5):
        obs = rng.standard_normal((4, 4)).astype(np.float32)
        before = actor.state.copy()
        values = actor.value(obs)
        np.testing.assert_array_equal(actor.state, before)  # value peeks, it does not step
        _, logp, value = actor.act(obs, rng)
        out, torch_value, state = policy.step(torch.from_numpy(obs), state)
        np.testing.assert_allclose(value, torch_value.detach().numpy(), atol=1e-5)
        np.testing.assert_allclose(values, value, atol=1e-6)
        np.testing.assert_allclose(actor.state, state.detach().numpy(), atol=1e-5)
    actor.episodes_started(np.array([True, False, True, False]))
    assert not actor.state[[0, 2]].any() and actor.state[[1, 3]].any()


def test_sequences_are_cut_per_sub_env_and_starts_follow_the_dones():
    x = np.arange(8 * 3).reshape(8, 3)  # (T=8, N=3): x[t, n] = 3 t + n
    seqs = to_sequences(x, 4)  # K=2 sequences a sub-env: sequence k*3 + n
    assert seqs.shape == (4, 6)
    assert seqs[:, 0].tolist() == [0, 3, 6, 9] and seqs[:, 4].tolist() == [13, 16, 19, 22]
    dones = np.zeros((8, 3), bool)
    dones[1, 0] = dones[3, 1] = True  # sub-env 1's episode ends at the last step of its first sequence
    starts = episode_starts(dones, 4)
    assert np.flatnonzero(starts[:, 0]).tolist() == [2] and not starts[:, 1].any()
    assert not starts[0].any()  # a sequence's first step: its recorded state says it


@pytest.mark.parametrize(
    ("kind", "seq_len", "critic_core"), [("lstm", 16, False), ("gru", 0, False), ("lstm", 8, True)]
)
def test_the_learner_replays_each_sequence_as_the_actor_acted(kind, seq_len, critic_core):
    """Short episodes (random CartPole ones end within ~30 steps) start and end inside sequences and
    at their edges; from the recorded start states, the learner's log-probabilities and values are the
    actor's, so PPO's first ratio is 1."""
    policy = _policy(kind, seq_len, critic_core=critic_core)
    envs = make_vector_env(ENV, 3)
    tasks = []
    for index in range(2):
        actor = policy.actor_snapshot()
        tasks.append(collect(actor, envs, 64, [10 * index + i for i in range(3)], action_seed=index))
    rollout = concat(tasks)
    length = seq_len or 64
    assert rollout.states.shape == (64 // length, 6, policy.state_size)
    assert rollout.dones.sum() >= 4
    assert not rollout.states[0].any()  # fresh episodes: the first sequence starts from zeros
    obs = torch.from_numpy(to_sequences(rollout.obs, length))
    actions = torch.from_numpy(to_sequences(rollout.actions, length))
    starts = episode_starts(rollout.dones, length)
    states = torch.from_numpy(rollout.states.reshape(-1, policy.state_size))
    with torch.no_grad():
        logprob, _, value = policy.evaluate_sequences(obs, actions, starts, states)
    np.testing.assert_allclose(logprob.numpy(), to_sequences(rollout.logprobs, length).reshape(-1), atol=2e-5)
    np.testing.assert_allclose(value.numpy(), to_sequences(rollout.values, length).reshape(-1), atol=2e-5)


def test_without_the_zeroing_at_episode_starts_the_replay_differs():
    """The check above can fail: a learner that does not zero the state where episodes start sees
    other log-probabilities than the actor's."""
    policy = _policy("lstm")
    rollout = collect(policy.actor_snapshot(), make_vector_env(ENV, 3), 64, [1, 2, 3], action_seed=0)
    assert rollout.dones[:-1].any()
    obs = torch.from_numpy(to_sequences(rollout.obs, 64))
    actions = torch.from_numpy(to_sequences(rollout.actions, 64))
    never = np.zeros(obs.shape[:2], bool)
    with torch.no_grad():
        logprob, _, _ = policy.evaluate_sequences(obs, actions, never, torch.from_numpy(rollout.states[0]))
    assert not np.allclose(logprob.numpy(), to_sequences(rollout.logprobs, 64).reshape(-1), atol=2e-5)


def test_a_greedy_episode_starts_with_an_empty_memory():
    """run_episodes begins each episode anew: two evaluations of one seed give one return, whatever
    the actor did before."""
    policy = _policy("gru")
    actor = policy.actor_snapshot()
    env = make_env(ENV)
    first = run_episodes(actor, env, 2, seed=5)
    actor.begin(1, np.ones((1, actor.state.shape[1]), np.float32))
    again = run_episodes(actor, env, 2, seed=5)
    np.testing.assert_array_equal(first, again)


def test_feed_forward_configs_build_the_feed_forward_network():
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.algos.ppo.ppo import PPO

    config = dataclasses.replace(PolicyConfig(), hidden_sizes=(8,))
    assert type(PPO.build_network(describe(ENV), config)) is ActorCritic
    assert type(PPO.build_network(describe(ENV), dataclasses.replace(config, recurrent="gru"))) is RecurrentActorCritic


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_minibatch_of_sequences_cut_into_fragments_is_the_step_by_step_loop(kind):
    """RecurrentCore.sequence runs the fused layer once over padded fragments; stepping one step at a
    time and zeroing the state where episodes start gives the same outputs."""
    torch.manual_seed(2)
    core = RecurrentCore(kind, 3, 6)
    rng = np.random.default_rng(4)
    steps, batch = 12, 5
    starts = rng.random((steps, batch)) < 0.2
    starts[0] = False
    starts[:, 2] = False  # one sequence without a cut
    starts[1:, 3] = True  # one cut at every step
    x = torch.from_numpy(rng.standard_normal((steps, batch, 3)).astype(np.float32))
    state = torch.from_numpy(rng.standard_normal((batch, core.state_size)).astype(np.float32))
    with torch.no_grad():
        fused = core.sequence(x, starts, state)
        loop, s = [], state
        for t in range(steps):
            s = s * torch.from_numpy(~starts[t]).float().unsqueeze(-1)
            out, s = core.step(x[t], s)
            loop.append(out)
    np.testing.assert_allclose(fused.numpy(), torch.stack(loop).numpy(), atol=1e-6)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["policy.recurrent=rnn"], 'policy.recurrent must be lstm, gru or "" \\(none\\)'),
        (["algo=dqn", "policy.recurrent=lstm"], "dqn learns feed-forward policies only .* learned by ppo"),
        (["mode=async", "policy.recurrent=gru"], "ppo learns recurrent policies in mode sync only; not in mode async"),
        (["policy.recurrent=lstm", "policy.seq_len=1024"], "longer than a task \\(farm.steps_per_env = 512\\)"),
        (["policy.recurrent=lstm", "policy.seq_len=100"], "does not divide farm.steps_per_env = 512"),
        (["policy.recurrent=lstm", "policy.seq_len=-1"], "cannot be negative"),
        (["policy.recurrent=lstm", "policy.recurrent_size=0"], "policy.recurrent_size must be at least 1"),
        (["policy.recurrent=lstm", "policy.recurrent_size=100000"], "above its bound"),
        (["policy.recurrent=gru", "ppo.compile=default"], "eager fp32"),
    ],
)
def test_what_is_not_built_is_one_line_before_anything_starts(overrides, fragment):
    from rlfarm import config as C

    with pytest.raises(C.ConfigError, match=fragment) as caught:
        C.build("cartpole-ppo", overrides)
    assert "\n" not in str(caught.value)


def test_a_sequence_as_long_as_a_task_or_dividing_it_is_accepted():
    """The edges of the refusals above: seq_len equal to farm.steps_per_env, a divisor of it, 0."""
    from rlfarm import config as C

    for seq_len in (512, 256, 1, 0):
        C.build("cartpole-ppo", ["policy.recurrent=lstm", f"policy.seq_len={seq_len}"])


def test_a_state_of_another_shape_is_refused_not_half_used():
    """A stream's saved memory that does not fit the actor (another core, another batch) is refused."""
    actor = _policy("lstm").actor_snapshot()
    actor.begin(3, np.ones((3, actor.state.shape[1]), np.float32))
    assert actor.state.shape == (3, 32) and actor.state.all()
    for shape in ((3, 31), (2, 32)):
        with pytest.raises(ValueError, match="a recurrent state of shape"):
            actor.begin(3, np.zeros(shape, np.float32))


def test_a_recurrent_sync_runs_last_iteration_is_whole_sequences():
    """A SYNC run's shorter last iteration is rounded up to whole sequences (config.length.task_steps)."""
    from rlfarm import config as C

    cfg = C.build("cartpole-ppo", ["policy.recurrent=lstm", "policy.seq_len=64", "total_steps=41000"])
    last = cfg.task_steps((cfg.num_iterations - 1) * cfg.steps_per_iteration)
    assert last % 64 == 0 and 0 < last < 512
    plain = C.build("cartpole-ppo", ["total_steps=41000"])
    assert plain.task_steps((plain.num_iterations - 1) * plain.steps_per_iteration) % 64 != 0


def test_a_loaded_recurrent_policy_predicts_with_the_state_it_returns(tmp_path):
    """rlfarm.load(...).predict(obs, state, episode_start) as sb3-contrib's RecurrentPPO: the state it
    returns goes into the next call; an episode start zeroes it; greedy actions follow the network."""
    import rlfarm
    from rlfarm import config as C
    from rlfarm.algos.ppo.ppo import PPO
    from rlfarm.trainer.summary import write_final_policy

    cfg = C.build("cartpole-no-vel-lstm", ["policy.recurrent_size=8", "policy.hidden_sizes=[16]"])
    torch.manual_seed(0)
    network = PPO.build_network(describe(ENV), cfg.policy)
    path = write_final_policy(tmp_path, cfg, describe(ENV), network.state_dict(), 3, None)
    policy = rlfarm.load(path)
    env = make_env(ENV)
    obs, _ = env.reset(seed=0)
    state, start = None, np.ones(1, bool)
    torch_state = torch.zeros(1, network.state_size)
    ends = 0
    for _ in range(40):  # greedy and untrained: episodes of about ten steps, several starts
        action, state = policy.predict(obs, state=state, episode_start=start, deterministic=True)
        out, _, torch_state = network.step(torch.from_numpy(obs[None]), torch_state)
        assert action == int(out.argmax()) and state.shape == (1, network.state_size)
        np.testing.assert_allclose(state, torch_state.detach().numpy(), atol=1e-5)
        obs, _, terminated, truncated, _ = env.step(action)
        start = np.array([terminated or truncated])
        if start[0]:
            obs, _ = env.reset()
            torch_state, ends = torch.zeros_like(torch_state), ends + 1
    assert ends >= 2
    _, fresh = policy.predict(obs, state=state, episode_start=np.ones(1, bool))
    _, carried = policy.predict(obs, state=state, episode_start=np.zeros(1, bool))
    assert not np.allclose(fresh, carried)


def test_the_card_game_deals_one_hot_suits_and_needs_popgym(monkeypatch):
    """rlfarm/repeat_previous: POPGym's RepeatPreviousEasy, its card a one-hot Box; without POPGym,
    one line naming what to install."""
    import sys

    from rlfarm.errors import EnvError

    pytest.importorskip("popgym", reason='popgym is not installed (pip install -e ".[memory]")')
    env = make_env("rlfarm/repeat_previous")
    obs, _ = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (4,) and obs.sum() == 1.0
    steps, total, done = 0, 0.0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(0)
        steps, total, done = steps + 1, total + reward, terminated or truncated
        assert obs.sum() == 1.0
    assert steps == 51 and -1.0 <= total <= 1.0
    monkeypatch.setitem(sys.modules, "popgym.envs.repeat_previous", None)
    with pytest.raises(EnvError, match="could not be constructed: MissingPackage: .* pip install popgym"):
        make_env("rlfarm/repeat_previous")

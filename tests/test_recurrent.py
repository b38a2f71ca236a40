"""Recurrent policies (policy.recurrent, issue 53), in one process: the numpy cells are torch's, an
actor carries its state and zeroes it where episodes start, a task records each sequence's start state,
and the learner's sequences replay exactly what the actor acted with (its first epoch's ratio is 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlfarm.algos.ppo.policies import RecurrentActorCritic
from rlfarm.algos.ppo.sequences import (
    episode_starts,
    from_sequences,
    next_step_starts,
    to_sequences,
    with_next_step,
)
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
    assert_replayed_as_acted(policy, rollout, length)


def assert_replayed_as_acted(policy: RecurrentActorCritic, rollout, length: int) -> None:
    """The network's log-probabilities and values of the rollout's sequences of `length` steps, each
    replayed from its recorded state, are the actor's (tests/test_recurrent_images.py too)."""
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
        (["policy.recurrent=lstm", "policy.seq_len=64", "policy.burn_in=64"], "burn-in is 0 \\(none\\) to 63 steps"),
        (["policy.recurrent=lstm", "policy.burn_in=-1"], "burn-in is 0 \\(none\\) to 511 steps"),
        (["policy.burn_in=4"], "refreshes a recurrent policy's state; set policy.recurrent"),
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
    C.build("cartpole-ppo", ["policy.recurrent=lstm", "policy.seq_len=64", "policy.burn_in=63"])
    C.build("cartpole-ppo", ["policy.recurrent=lstm", "policy.burn_in=511"])
    C.build("cartpole-ppo", ["policy.recurrent=gru", "mode=async"])  # recurrent APPO


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


def test_a_sequence_and_the_step_after_it_come_from_the_task_in_order():
    """with_next_step: each sequence of L steps and the step after it (the next sequence's first, or
    the observation after the task); from_sequences undoes to_sequences."""
    T, N, L = 12, 3, 4
    x = np.arange(T * N).reshape(T, N)
    after = np.array([100, 101, 102])
    seqs = to_sequences(x, L)
    np.testing.assert_array_equal(from_sequences(seqs, N), x)
    extended = with_next_step(x, after, L)
    assert extended.shape == (L + 1, (T // L) * N)
    np.testing.assert_array_equal(extended[:L], seqs)
    np.testing.assert_array_equal(extended[L], [x[4, 0], x[4, 1], x[4, 2], x[8, 0], x[8, 1], x[8, 2], 100, 101, 102])
    dones = np.zeros((T, N), bool)
    dones[3, 1] = dones[11, 2] = dones[5, 0] = True
    starts = next_step_starts(dones, L)
    assert starts[L].nonzero()[0].tolist() == [1, 8]  # sequence 0 of env 1, sequence 2 of env 2
    assert starts[2, 3] and starts.sum() == 3  # (the start after step 5 is step 6: row 2 of sequence 1)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_burned_in_sequence_is_the_same_forward_and_passes_no_gradient_through_its_burn_in(kind):
    """RecurrentCore.sequence with burn_in: with the network that recorded the state, the same
    outputs as without (zeroing at starts inside and at the end of the burn-in included); the burn-in
    steps pass no gradient, the rest do."""
    torch.manual_seed(3)
    core = RecurrentCore(kind, 3, 6)
    rng = np.random.default_rng(5)
    steps, batch, burn_in = 10, 4, 3
    starts = np.zeros((steps, batch), bool)
    starts[1, 0] = starts[3, 1] = starts[6, 2] = True  # inside the burn-in, at its end, after it
    x = torch.from_numpy(rng.standard_normal((steps, batch, 3)).astype(np.float32)).requires_grad_(True)
    state = torch.from_numpy(rng.standard_normal((batch, core.state_size)).astype(np.float32))
    plain = core.sequence(x, starts, state)
    burned = core.sequence(x, starts, state, burn_in)
    np.testing.assert_allclose(burned.detach().numpy(), plain.detach().numpy(), atol=1e-6)
    burned.sum().backward()
    assert not x.grad[:burn_in].any() and x.grad[burn_in:].abs().sum(-1).all()


def _appo(seq_len: int, burn_in: int = 0, seed: int = 0, *overrides: str):
    from rlfarm import config as C
    from rlfarm.algos.ppo.appo import APPO

    cfg = C.build(
        None,
        [
            "algo=ppo",
            "mode=async",
            f"env.id={ENV}",
            "env.num_envs=3",
            "farm.steps_per_env=64",
            "policy.hidden_sizes=[32]",
            "policy.recurrent=lstm",
            "policy.recurrent_size=16",
            f"policy.seq_len={seq_len}",
            f"policy.burn_in={burn_in}",
            *overrides,
        ],
        seed=seed,
    )
    torch.manual_seed(seed)
    return APPO(cfg, describe(ENV), torch.device("cpu"))


@pytest.mark.parametrize(("seq_len", "burn_in"), [(4, 0), (8, 3), (0, 0)])
def test_appos_targets_replay_the_behaviour_and_bootstrap_from_the_step_after_the_task(seq_len, burn_in):
    """Recurrent APPO recomputes V-trace's target log-probabilities and values by replaying each
    sequence from its recorded state; with the network that acted they are the actor's (so rho is 1),
    burn-in or not, and the value after the task is the actor's last value, the state carried through
    the task's last sequence (and zeroed where an episode ended at its last step)."""
    learner = _appo(seq_len, burn_in)
    envs = make_vector_env(ENV, 3)
    rollout = concat(
        [collect(learner.policy.actor_snapshot(), envs, 64, [7 * i + j + 1 for j in range(3)], i) for i in range(2)]
    )
    length = seq_len or 64
    assert rollout.dones[length - 1 :: length].any() or seq_len == 0  # an episode ends where a sequence does
    logprobs, values, last_values = learner._evaluate(rollout)
    np.testing.assert_allclose(logprobs, rollout.logprobs, atol=2e-5)
    np.testing.assert_allclose(values, rollout.values, atol=2e-5)
    np.testing.assert_allclose(last_values, rollout.last_values, atol=2e-5)
    metrics = learner.update(0.0) if learner.observe(rollout, 0) is None and learner.ready() else {}
    assert metrics["vtrace/rho_clipped_frac"] == 0.0 and abs(metrics["vtrace/rho_mean"] - 1.0) < 1e-4


def test_a_stale_states_error_is_in_a_sequences_first_steps_which_burn_in_leaves_out():
    """Why R2D2's burn-in: a task acted by one version, replayed by a later one from the states the
    first recorded. The later network's values stray from those it gives with its own memory carried
    through the whole task mostly in each sequence's first steps (the stale state washes out), and
    those are the steps a burn-in of 4 leaves out of the loss."""
    acted = _appo(8, seed=1)
    rollout = collect(acted.policy.actor_snapshot(), make_vector_env(ENV, 3), 64, [1, 2, 3], 0)
    later = _appo(8, seed=2)  # another network: the stored states are not its own
    truth = _appo(0, seed=2)  # the same network, one sequence per task: its own memory throughout
    _, own, _ = truth._evaluate(dataclasses.replace(rollout, states=rollout.states[:1]))  # (fresh: zeros)
    _, stale, _ = later._evaluate(rollout)
    t = np.arange(64)
    error = np.abs(stale - own)
    early, late = error[(t >= 8) & (t % 8 < 4)].mean(), error[(t >= 8) & (t % 8 >= 4)].mean()
    print(f"mean |value error| from a stale state: steps 0-3 of a sequence {early:.2e}, steps 4-7 {late:.2e}")
    assert late < 0.5 * early
    np.testing.assert_allclose(error[:8], 0.0, atol=2e-6)  # the first sequence starts from zeros: exact


def test_burn_in_steps_are_out_of_the_loss():
    """With policy.burn_in = 4, advantages on the burn-in steps only move nothing; without burn-in the
    same batch moves the weights (only the surrogate acts: no entropy bonus, no value loss)."""
    moved = {}
    for burn_in in (0, 4):
        learner = _appo(8, burn_in, 0, "ppo.ent_coef=0", "ppo.vf_coef=0")
        rollout = collect(learner.policy.actor_snapshot(), make_vector_env(ENV, 3), 64, [1, 2, 3], 0)
        burning = np.broadcast_to(((np.arange(64) % 8) < 4)[:, None], rollout.values.shape)
        advantages = np.where(burning, np.linspace(-1, 1, rollout.values.size).reshape(rollout.values.shape), 0)
        before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
        learner._optimize_sequences(
            rollout, rollout.logprobs, rollout.values, advantages.astype(np.float32), rollout.values
        )
        after = learner.policy.state_dict()
        moved[burn_in] = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved[0] > 1e-4 and moved[4] == 0.0, moved

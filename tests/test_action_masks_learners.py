"""Action masks in the learners (SpaceSpec.action_mask, Rollout.action_masks / next_action_masks):
PPO and APPO score only the legal actions (log-probabilities and entropy of the masked softmax, the
masks following every minibatch path), DQN's Double-DQN target maximises over the legal next
actions, and the replay keeps the masks through n-step windows, the ring buffer and checkpoints.
An all-legal mask changes nothing, bit for bit. Hand-built rollouts: no env, no process."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.core.replay import Batch, PrioritizedReplayBuffer, ReplayBuffer, Transitions, nstep_transitions
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec
from rlfarm.trainer import resume

T, N, A, OBS = 8, 4, 5, 3
SPEC = SpaceSpec(OBS, True, A, action_mask=True)
# The legal actions of each step are a function of its observation (obs[..., 0] indexes this table), so a
# mask that reaches the network with another step's observation is caught. Row 0 (every action legal)
# is also the observation after the task (APPO's bootstrap rows).
TABLE = np.array(
    [
        [1, 1, 1, 1, 1],
        [1, 0, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [1, 0, 1, 0, 1],
        [0, 0, 0, 1, 1],
        [0, 1, 1, 1, 1],
    ],
    bool,
)
PPO_SMALL = ["ppo.num_minibatches=2", "policy.hidden_sizes=[16, 16]", "env.num_envs=4", "farm.steps_per_env=8"]


def masked_rollout(seed: int = 0, active: np.ndarray | None = None, masks: bool = True) -> Rollout:
    """T x N steps whose actions are legal under their masks; with `active`, the steps of agents out
    of their game have no legal action at all (an all-False mask only they may carry)."""
    rng = np.random.default_rng(seed)
    pattern = rng.integers(1, len(TABLE), (T, N))
    obs = rng.normal(size=(T, N, OBS)).astype(np.float32)
    obs[..., 0] = pattern
    action_masks = TABLE[pattern]
    actions = np.array([[rng.choice(np.flatnonzero(m)) for m in row] for row in action_masks], np.int64)
    if active is not None:
        action_masks = action_masks & active[..., None]
    dones = rng.random((T, N)) < 0.1
    return Rollout(
        obs,
        actions,
        rng.normal(-1.0, 0.3, (T, N)).astype(np.float32),  # behaviour log-probabilities
        rng.normal(size=(T, N)).astype(np.float32),
        rng.normal(size=(T, N)).astype(np.float32),
        dones,
        np.zeros((T, N), np.float32),
        np.zeros(N, np.float32),
        np.zeros(0),
        np.zeros(0, np.int64),
        last_obs=np.zeros((N, OBS), np.float32),  # pattern 0: all legal
        active=active,
        action_masks=action_masks if masks else None,
    )


def ppo_learner(mode: str, *overrides: str, seed: int = 0):
    cfg = C.build(None, ["algo=ppo", f"mode={mode}", "env.id=CartPole-v1", *PPO_SMALL, *overrides], seed=seed)
    torch.manual_seed(seed)
    return learner("ppo", mode)(cfg, SPEC, torch.device("cpu"))


def update(algorithm, rollout: Rollout) -> dict[str, float]:
    algorithm.observe(rollout, policy_lag=0)
    metrics = {}
    while algorithm.ready():
        metrics = algorithm.update(0.25)
    return metrics


def spy_on_evaluate(policy, monkeypatch) -> list[dict[str, torch.Tensor]]:
    """Record every ActorCritic.evaluate call: its masks, whether it carried gradients, and its
    log-probabilities and entropy next to a hand computation of the masked softmax's."""
    calls = []
    original = policy.evaluate

    def evaluate(obs, actions, mask=None, autocast=None):
        logprob, entropy, value = original(obs, actions, mask, autocast)
        with torch.no_grad():
            logits = policy._heads(obs)[0]
            legal = mask if mask is not None else torch.ones_like(logits, dtype=torch.bool)
            logp = logits.masked_fill(~legal, -math.inf).log_softmax(-1)  # softmax over the legal logits
            hand_entropy = -torch.where(legal, logp.exp() * logp, 0.0).sum(-1)
            hand_logprob = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        calls.append(
            {
                "obs": obs,
                "mask": mask,
                "grad": torch.is_grad_enabled(),
                "logprob": logprob.detach(),
                "entropy": entropy.detach(),
                "hand_logprob": hand_logprob,
                "hand_entropy": hand_entropy,
            }
        )
        return logprob, entropy, value

    monkeypatch.setattr(policy, "evaluate", evaluate)
    return calls


def check_masked_scores(calls: list[dict[str, torch.Tensor]]) -> None:
    """Every call had the masks of its own observations, and scored with the masked softmax."""
    assert calls
    for call in calls:
        mask = call["mask"]
        assert mask is not None
        rows = mask.any(-1)  # (an all-False row: an agent out of its game, never in a loss)
        assert not call["grad"] or rows.all()
        assert torch.equal(mask[rows], torch.from_numpy(TABLE[call["obs"][rows, 0].long().numpy()]))
        torch.testing.assert_close(call["logprob"][rows], call["hand_logprob"][rows], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(call["entropy"][rows], call["hand_entropy"][rows], rtol=1e-5, atol=1e-5)
    # The premise: some scored step had an illegal action, so an unmasked softmax would differ.
    assert any((~c["mask"][c["mask"].any(-1)]).any() for c in calls)


def test_illegal_actions_get_no_gradient_and_a_finite_entropy():
    policy = ppo_learner("sync").policy
    logits = torch.randn(6, A, requires_grad=True)
    mask = torch.from_numpy(TABLE)
    dist = policy._distribution(logits, mask)
    actions = torch.tensor([np.flatnonzero(m)[0] for m in TABLE])
    (dist.log_prob(actions).sum() + dist.entropy().sum()).backward()
    assert torch.isfinite(dist.entropy()).all()
    assert (logits.grad[~mask] == 0).all() and (logits.grad[mask] != 0).any()
    assert dist.probs[~mask].max() == 0
    assert dist.entropy()[1] == 0  # one legal action: certain


@pytest.mark.parametrize(
    "mode, overrides",
    [
        ("sync", ["ppo.update_epochs=2"]),
        ("async", ["ppo.update_epochs=1", "async.results_per_update=1"]),  # one pass: V-trace per chunk
        ("async", ["ppo.update_epochs=2", "async.results_per_update=1"]),  # targets first, then the epochs
    ],
    ids=["ppo", "appo-one-pass", "appo-two-pass"],
)
def test_an_all_legal_mask_updates_bit_identically_to_no_mask(mode, overrides):
    rollout = masked_rollout(seed=1)
    plain = Rollout.from_dict({**rollout.to_dict(), "action_masks": None})
    all_legal = Rollout.from_dict({**rollout.to_dict(), "action_masks": np.ones((T, N, A), bool)})
    unmasked, masked = ppo_learner(mode, *overrides), ppo_learner(mode, *overrides)
    if mode == "async":
        assert masked._one_pass(all_legal) == ("ppo.update_epochs=1" in overrides)
    assert update(unmasked, plain) == update(masked, all_legal)
    a, b = unmasked.state(), masked.state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # ... and a mask that forbids something changes the update (so the mask reached the learner).
    forbidding = ppo_learner(mode, *overrides)
    update(forbidding, rollout)
    assert any(not torch.equal(a[k], v) for k, v in forbidding.state().items())


@pytest.mark.parametrize(
    "mode, overrides, one_pass",
    [
        ("sync", ["ppo.update_epochs=2"], False),
        ("async", ["ppo.update_epochs=1", "async.results_per_update=1"], True),
        ("async", ["ppo.update_epochs=2", "async.results_per_update=1"], False),
        ("async", ["ppo.update_epochs=2", "async.results_per_update=1", "ppo.clip_to=proximal"], False),
    ],
    ids=["ppo", "appo-one-pass", "appo-two-pass", "appo-two-pass-proximal"],
)
def test_the_learner_scores_taken_actions_with_the_masked_softmax(mode, overrides, one_pass, monkeypatch):
    algorithm = ppo_learner(mode, *overrides)
    rollout = masked_rollout(seed=2)
    if mode == "async":
        assert algorithm._one_pass(rollout) == one_pass
    calls = spy_on_evaluate(algorithm.policy, monkeypatch)
    metrics = update(algorithm, rollout)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    check_masked_scores(calls)
    # Every step was learned from, each with its mask (and APPO's targets computed with them too).
    learned = sum(len(c["obs"]) for c in calls if c["grad"])
    epochs = 1 if one_pass else 2
    assert learned == T * N * epochs + (N if one_pass else 0)  # (one pass: the bootstrap rows ride along)
    if mode == "async" and not one_pass:
        assert sum(len(c["obs"]) for c in calls if not c["grad"]) == T * N


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_masks_follow_the_steps_of_the_agents_still_in_their_game(mode, monkeypatch):
    """With Rollout.active, the steps of agents out of their game (here: no legal action) leave every
    minibatch, and the masks of the others stay with their own steps."""
    active = np.ones((T, N), bool)
    active[4:, 1] = False
    active[2:, 3] = False
    algorithm = ppo_learner(mode, "ppo.update_epochs=2", *(["async.results_per_update=1"] if mode == "async" else []))
    rollout = masked_rollout(seed=3, active=active)
    calls = spy_on_evaluate(algorithm.policy, monkeypatch)
    metrics = update(algorithm, rollout)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    check_masked_scores(calls)
    assert sum(len(c["obs"]) for c in calls if c["grad"]) == 2 * active.sum()


def test_appos_circular_buffer_keeps_the_masks_of_its_batches_through_a_checkpoint():
    overrides = ["ppo.update_epochs=1", "async.results_per_update=1", "ppo.buffer_batches=2", "ppo.batch_passes=2"]
    whole = ppo_learner("async", *overrides)
    update(whole, masked_rollout(seed=4))  # batch 0 learned from once, waits in the buffer for its second pass
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}
    resumed = ppo_learner("async", *overrides, seed=42)
    resumed.restore(tensors, state)
    np.testing.assert_array_equal(resumed._slots[0][0].action_masks, masked_rollout(seed=4).action_masks)
    for algorithm in (whole, resumed):
        update(algorithm, masked_rollout(seed=5))
    a, b = whole.state(), resumed.state()
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- DQN and replay -----------------------------------------------------------------------------


def offpolicy_rollout(active: np.ndarray | None = None, masks: bool = True) -> Rollout:
    """T=4 steps of N=2 envs: env 0 terminates at step 1, env 1 runs on. next_obs[t, n, 0] = t * N + n
    names each step, and its next mask is MASKS[t * N + n]."""
    steps, envs = 4, 2
    rng = np.random.default_rng(7)
    next_masks = rng.random((steps, envs, A)) < 0.5
    next_masks[..., 0] = True  # at least one legal action everywhere
    next_obs = np.zeros((steps, envs, OBS), np.float32)
    next_obs[..., 0] = np.arange(steps * envs).reshape(steps, envs)
    dones = np.zeros((steps, envs), bool)
    dones[1, 0] = True
    return Rollout(
        rng.normal(size=(steps, envs, OBS)).astype(np.float32),
        rng.integers(0, A, (steps, envs)),
        np.zeros((steps, envs), np.float32),
        np.zeros((steps, envs), np.float32),
        np.ones((steps, envs), np.float32),
        dones,
        np.zeros((steps, envs), np.float32),
        np.zeros(envs, np.float32),
        np.zeros(0),
        np.zeros(0, np.int64),
        next_obs=next_obs,
        terminations=dones.copy(),
        active=active,
        action_masks=np.ones((steps, envs, A), bool) if masks else None,
        next_action_masks=next_masks if masks else None,
    )


@pytest.mark.parametrize(
    "n, last",
    [
        (1, [[0, 0], [1, 1], [2, 2], [3, 3]]),
        (3, [[1, 2], [1, 3], [3, 3], [3, 3]]),  # env 0's windows stop at its end (step 1); all at the task's end
    ],
)
def test_nstep_transitions_carry_the_masks_of_their_next_observations(n, last):
    rollout = offpolicy_rollout()
    t = nstep_transitions(rollout, n=n, gamma=0.9)
    last = np.asarray(last)
    expected = rollout.next_action_masks[last, np.arange(2)[None, :]].reshape(-1, A)
    np.testing.assert_array_equal(t.next_obs[:, 0], (last * 2 + np.arange(2)).reshape(-1))  # the premise
    np.testing.assert_array_equal(t.next_action_masks, expected)

    active = np.ones((4, 2), bool)
    active[2:, 1] = False
    kept = nstep_transitions(offpolicy_rollout(active=active), n=n, gamma=0.9)
    assert len(kept) == 6
    flat = rollout.next_action_masks.reshape(-1, A)
    np.testing.assert_array_equal(kept.next_action_masks, flat[kept.next_obs[:, 0].astype(int)])
    assert nstep_transitions(offpolicy_rollout(masks=False), n=n, gamma=0.9).next_action_masks is None


def transitions(values, masks: bool = True) -> Transitions:
    v = np.asarray(values, np.float32)
    n = len(v)
    legal = np.stack([(np.arange(A) + int(x)) % 3 == 0 for x in v]) if masks else None  # a function of the value
    return Transitions(v[:, None], np.arange(n), v, v[:, None], np.zeros(n, bool), np.ones(n, np.float32), legal)


@pytest.mark.parametrize("buffer", [ReplayBuffer, PrioritizedReplayBuffer])
def test_replay_stores_samples_and_restores_the_masks(buffer):
    buf = buffer(4, obs_shape=1, seed=3)
    buf.add(transitions([0, 1, 2]))
    buf.add(transitions([3, 4, 5, 6, 7]))  # more than the buffer holds: the newest 4, with their masks
    assert sorted(buf.rewards.tolist()) == [4, 5, 6, 7]
    batch = buf.sample(64)
    np.testing.assert_array_equal(batch.next_action_masks, transitions(batch.next_obs[:, 0]).next_action_masks)

    arrays, meta = buf.state()
    restored = buffer(4, obs_shape=1, seed=99)
    restored.restore({k: v.copy() for k, v in arrays.items()}, meta)
    a, b = buf.sample(64), restored.sample(64)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.next_action_masks, b.next_action_masks)

    plain = buffer(4, obs_shape=1)
    plain.add(transitions([0, 1, 2, 3, 4], masks=False))
    assert plain.sample(8).next_action_masks is None and "next_action_masks" not in plain.state()[0]


DQN_SPEC = SpaceSpec(OBS, True, A, action_mask=True)


def dqn_learner(seed: int = 0, *overrides: str):
    cfg = C.build(
        None,
        [
            "algo=dqn",
            "mode=async",
            "env.id=CartPole-v1",
            "env.num_envs=2",
            "farm.steps_per_env=4",
            "dqn.learning_starts=0",
            "dqn.batch_size=8",
            "dqn.buffer_size=64",
            "dqn.replay_ratio=1",
            "policy.hidden_sizes=[16, 16]",
            *overrides,
        ],
        seed=seed,
    )
    torch.manual_seed(seed)
    algorithm = learner("dqn", "async")(cfg, DQN_SPEC, torch.device("cpu"))
    with torch.no_grad():  # a target network unlike the online one: Double DQN's two roles tell apart
        for p in algorithm.target_network.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return algorithm


def dqn_batch(size: int = 16, next_action_masks: np.ndarray | None = None) -> Batch:
    rng = np.random.default_rng(11)
    return Batch(
        rng.normal(size=(size, OBS)).astype(np.float32),
        rng.integers(0, A, size),
        rng.uniform(20, 30, size).astype(np.float32),  # far above any Q at init: td = target - q > 0
        rng.normal(size=(size, OBS)).astype(np.float32),
        np.zeros(size, bool),
        np.full(size, 0.9, np.float32),
        np.ones(size, np.float32),
        np.arange(size),
        next_action_masks,
    )


def test_the_double_dqn_target_takes_the_best_legal_next_action():
    algorithm = dqn_learner()
    batch = dqn_batch()
    with torch.no_grad():
        online_next = algorithm.q_network(torch.from_numpy(batch.next_obs))
        target_next = algorithm.target_network(torch.from_numpy(batch.next_obs))
        q = algorithm.q_network(torch.from_numpy(batch.obs)).gather(-1, torch.from_numpy(batch.actions)[:, None])[:, 0]
    best = online_next.argmax(-1).numpy()
    legal = np.random.default_rng(5).random((len(best), A)) < 0.6
    legal[np.arange(len(best)), best] = False  # the action of the largest Q is illegal
    legal[np.arange(len(best)), (best + 1) % A] = True
    legal[-2] = False  # no legal action but not done: taken as all legal
    batch.next_action_masks = legal
    batch.dones[-1] = True  # a finished game with no legal action: no bootstrap
    batch.next_action_masks[-1] = False

    _, td = algorithm.train_step(batch)
    target = td + q.numpy()
    picked = online_next.masked_fill(~torch.from_numpy(legal), -math.inf).argmax(-1)
    picked[-2] = best[-2]
    expected = batch.rewards + batch.discounts * target_next.gather(-1, picked[:, None])[:, 0].numpy()
    expected[-1] = batch.rewards[-1]
    np.testing.assert_allclose(target, expected, rtol=1e-5)
    unmasked = batch.rewards + batch.discounts * target_next.gather(-1, torch.from_numpy(best)[:, None])[:, 0].numpy()
    assert not np.allclose(target[:-2], unmasked[:-2], rtol=1e-3)  # the premise: the illegal max mattered


def test_an_all_legal_next_mask_gives_the_dqn_step_of_no_mask():
    plain, masked = dqn_learner(), dqn_learner()
    m1, td1 = plain.train_step(dqn_batch())
    m2, td2 = masked.train_step(dqn_batch(next_action_masks=np.ones((16, A), bool)))
    assert m1 == m2 and np.array_equal(td1, td2)
    a, b = plain.state(), masked.state()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("prioritized", [False, True])
def test_dqn_learns_from_masked_results_and_its_checkpoint_keeps_the_masks(prioritized, tmp_path):
    extra = [f"dqn.prioritized={str(prioritized).lower()}", "dqn.n_step=3"]
    whole = dqn_learner(0, *extra)
    metrics = update(whole, offpolicy_rollout())
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert whole.replay.next_action_masks is not None
    resume.save(tmp_path, *whole.checkpoint())  # the file a resumed run reads
    resumed = dqn_learner(42, *extra)
    resumed.restore(*resume.load(tmp_path))
    size = len(whole.replay)
    np.testing.assert_array_equal(resumed.replay.next_action_masks[:size], whole.replay.next_action_masks[:size])
    for algorithm in (whole, resumed):
        update(algorithm, offpolicy_rollout())
    a, b = whole.state(), resumed.state()
    assert all(torch.equal(a[k], b[k]) for k in a)

"""Each shipped SYNC PPO preset's update against the implementation it names (`reference`).

One update of rlfarm's learner, built from the preset's config (its network, spaces and
hyper-parameters), on one iteration's batch of the preset's size (an image preset's cut to
IMAGE_STEPS steps per env), is compared with Stable-Baselines3's
`PPO.train()` ("sb3") or CleanRL's published update ("cleanrl", written out below) on the same batch,
from the same initial weights, in the same minibatch order, with the learning rate and clip range in
force at the same progress. Every parameter must end within TOLERANCE of the reference's. Presets are
found in the presets directory, so a new PPO preset is covered without a line here.

The batch is synthetic (an Atari rollout takes an emulator and minutes): random uint8 frames or
plausible float observations; actions sampled from the network itself with its log-probabilities and
values; rewards, episode ends and bootstrap values. Each reference computes its own advantages and
returns from them (SB3's `RolloutBuffer.compute_returns_and_advantage`, CleanRL's GAE loop written
out), so a bug in rlfarm's GAE shows as a different update. Unit tier (nothing starts a process),
but for the presets whose env starts one when it is made (`case_of`).

Both sides compute in float64 (the networks converted after they are built; the batch as float32
arrays, as on the farm). In float32 the Nature CNN's comparison measures rounding, not the update:
Adam's eps (1e-5) is larger than most of its gradients after clipping to norm 0.5, so a step there is
lr / eps times its gradient, and rounding flips ReLUs and clip decisions. On Pong's batch SB3 and
rlfarm ended 4.7e-4 apart in float32 with the same update (a copy of rlfarm's own update that only
used Adam's other kernel, 5.4e-5), against 2.0e-3 with CleanRL's value loss. In float64 the same
update agrees to 2e-16. The price: an Atari preset's update at its own batch size took about 20 s a
side on one core, hence IMAGE_STEPS.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.algos.ppo.policies import ActorCritic, RecurrentActorCritic, log_prob_entropy, policy_distribution
from rlfarm.algos.ppo.ppo import compute_gae
from rlfarm.config.keys import to_dict
from rlfarm.core.rollout import Rollout
from rlfarm.envs import SpaceSpec, make_env, space_spec

TOLERANCE = 1e-5  # max |difference| of any parameter after one update
DTYPE = torch.float64  # what both sides compute in (module docstring)
PROGRESS = 0.25  # the run's progress at the update: annealed rates and clip ranges are mid-way
# An image preset's batch is cut to this many steps per env (its envs, minibatch count and epochs as
# they are): an update's arithmetic is the same at any batch size, and at the Atari presets' 128 steps
# an update in float64 took about 20 s a side on one core, the costliest thing in the suite's CPU.
IMAGE_STEPS = 16
SB3_SKIP = "the sb3 comparisons need Stable-Baselines3 (the test extra: pip install -e '.[test]')"


def sync_ppo_presets() -> list[str]:
    """Every shipped preset that trains SYNC PPO."""
    return [name for name in C.preset_names() if (cfg := C.build(name)).algo == "ppo" and cfg.mode == "sync"]


def case_of(preset: str):
    """The preset as a test case: in the process tier where making its env starts a process (MuJoCo's
    envs import glfw, whose first import runs a Python subprocess to read its library's version)."""
    try:
        entry = str(gym.spec(C.build(preset).env.id).entry_point)
    except gym.error.Error:  # not registered before its package is imported (ale_py): not MuJoCo
        entry = ""
    return pytest.param(preset, marks=pytest.mark.process) if entry.startswith("gymnasium.envs.mujoco") else preset


PRESETS = sync_ppo_presets()

# One test process runs them all, so the negative control reuses the pong updates the pong test made
# (an Atari update in float64 is the costliest thing here; conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("reference-updates")


@pytest.fixture(autouse=True)
def _one_thread_own_rng():
    """One torch thread (the machine's cores are shared), and the global RNG these tests seed and
    draw from (SB3 initialises its policy from it) given back as it was."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def _forget_the_updates():
    """The cached updates (an Atari batch and its networks are tens of MB) go with this module."""
    yield
    rlfarm_update.cache_clear()
    sb3_update.cache_clear()


# ---- rlfarm's side: the batch and one update ----------------------------------------------------


@dataclass
class Case:
    """One preset's batch, rlfarm's network before and after its update, and what both sides share."""

    cfg: C.RunConfig
    spec: SpaceSpec
    observation_space: gym.Space
    action_space: gym.Space
    rollout: Rollout
    advantages: np.ndarray  # (T, N), rlfarm's GAE
    returns: np.ndarray
    perms: list[torch.Tensor]  # rlfarm's minibatch order of each epoch, over the time-major flattening
    initial: ActorCritic  # the network as the update began
    updated: ActorCritic
    metrics: dict[str, float]


def observation_sampler(space: gym.Space, spec: SpaceSpec, rng: np.random.Generator):
    """Draws observations (*shape, *obs_shape): uniform uint8 frames for images; for vectors each
    dimension from its own normal (so normalisation has work to do), uniform where the space bounds it."""
    if spec.is_image:
        return lambda shape: rng.integers(0, 256, (*shape, *spec.obs_shape), dtype=np.uint8)
    low = np.broadcast_to(np.asarray(space.low, np.float64).reshape(-1), (spec.obs_dim,))
    high = np.broadcast_to(np.asarray(space.high, np.float64).reshape(-1), (spec.obs_dim,))
    bounded = np.isfinite(low) & np.isfinite(high)
    loc, scale = rng.normal(0.0, 1.0, spec.obs_dim), np.exp(rng.normal(0.0, 1.0, spec.obs_dim))

    def sample(shape: tuple[int, ...]) -> np.ndarray:
        free = rng.normal(loc, scale, (*shape, spec.obs_dim))
        inside = rng.uniform(np.where(bounded, low, 0.0), np.where(bounded, high, 1.0), (*shape, spec.obs_dim))
        return np.where(bounded, inside, free).astype(np.float32)

    return sample


def synthetic_rollout(
    network: ActorCritic,
    spec: SpaceSpec,
    sample,
    T: int,
    N: int,
    rng: np.random.Generator,
    dtype: torch.dtype = torch.float32,
) -> Rollout:
    """T steps of N envs acted by `network`: its sampled actions, their log-probabilities and its
    values (so the update starts at ratio 1, as on the farm); rewards as the env gives them to the
    learner (Atari's clipped to their sign, sparse); a few episode ends, half of them truncations
    that bootstrap from a value, the rest terminations. Vector observations in `dtype`, the
    network's (float32 values either way); the rest float32, as a worker sends them."""

    def observations(shape: tuple[int, ...]) -> np.ndarray:
        obs = sample(shape)
        return obs if spec.is_image else obs.astype(torch.zeros(0, dtype=dtype).numpy().dtype)

    obs = observations((T + 1, N))  # row T: the observations after the last step
    flat = torch.from_numpy(obs.reshape((T + 1) * N, *obs.shape[2:]))
    with torch.no_grad():
        actions = network.distribution(flat[: T * N]).sample().to(torch.float32 if not spec.discrete else torch.int64)
        logprobs, _, values = network.evaluate(flat[: T * N], actions)
        last_values = network.get_value(flat[T * N :])
        final_obs_values = network.get_value(torch.from_numpy(observations((T * N,))))
    if spec.is_image:
        rewards = rng.choice(np.array([-1.0, 0.0, 1.0]), (T, N), p=[0.02, 0.96, 0.02])
    else:
        rewards = rng.normal(0.0, 1.0, (T, N))
    dones = rng.random((T, N)) < 0.02
    truncated = dones & (rng.random((T, N)) < 0.5)
    final_values = np.where(truncated, final_obs_values.numpy().reshape(T, N), 0.0)
    f32 = np.float32
    return Rollout(
        obs=obs[:T],
        actions=actions.numpy().reshape(T, N, *spec.action_shape),
        logprobs=logprobs.numpy().astype(f32).reshape(T, N),
        values=values.numpy().astype(f32).reshape(T, N),
        rewards=rewards.astype(f32),
        dones=dones,
        final_values=final_values.astype(f32),
        last_values=last_values.numpy().astype(f32),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
    )


def synthetic_recurrent_rollout(
    network: RecurrentActorCritic, spec: SpaceSpec, sample, T: int, N: int, rng: np.random.Generator
) -> Rollout:
    """synthetic_rollout for a recurrent network: acted step by step from zero states (fresh
    episodes: the one sequence of each sub-env starts from zeros), the state zeroed after each
    episode end, as a worker's actor does; its values and log-probabilities those the learner replays."""
    obs = sample((T + 1, N)).astype(np.float64)  # the network's dtype (DTYPE), as synthetic_rollout's
    dones = rng.random((T, N)) < 0.05
    truncated = dones & (rng.random((T, N)) < 0.5)
    state = torch.zeros(N, network.state_size, dtype=DTYPE)
    actions, logprobs, values, final_values = [], [], [], np.zeros((T, N))
    with torch.no_grad():
        for t in range(T):
            out, value, state = network.step(torch.from_numpy(obs[t]), state)
            dist = policy_distribution(spec, out, None if spec.discrete else network.actor_logstd)
            action = dist.sample()
            logprobs.append(log_prob_entropy(spec, dist, action)[0])
            actions.append(action)
            values.append(value)
            _, final, _ = network.step(torch.from_numpy(sample((N,)).astype(np.float64)), state)
            final_values[t] = np.where(truncated[t], final.numpy(), 0.0)
            state = state * torch.from_numpy(~dones[t]).to(DTYPE).unsqueeze(-1)
        _, last_values, _ = network.step(torch.from_numpy(obs[T]), state)
    f32 = np.float32
    return Rollout(
        obs=obs[:T],
        actions=torch.stack(actions).numpy().reshape(T, N, *spec.action_shape),
        logprobs=torch.stack(logprobs).numpy().astype(f32),
        values=torch.stack(values).numpy().astype(f32),
        rewards=rng.normal(0.0, 1.0, (T, N)).astype(f32),
        dones=dones,
        final_values=final_values.astype(f32),
        last_values=last_values.numpy().astype(f32),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        states=np.zeros((1, N, network.state_size), f32),
    )


@functools.cache
def rlfarm_update(preset: str, overrides: tuple[str, ...] = ()) -> Case:
    """The preset's learner (its network, spaces and hyper-parameters) after one update at PROGRESS on
    a batch of one iteration's size. Cached: the references copy what they need and change nothing."""
    with torch.random.fork_rng(devices=[]):
        cfg = C.build(preset, list(overrides))
        env = make_env(cfg.env.id, options=to_dict(cfg)["env"])  # the preset's preprocessing: its spaces
        try:
            # A multi-agent env is a vector of its agents (rlfarm.envs.agents): one agent's spaces.
            observation_space = getattr(env, "single_observation_space", env.observation_space)
            action_space = getattr(env, "single_action_space", env.action_space)
            spec = space_spec(env)
        finally:
            env.close()
        if spec.is_image and cfg.farm.steps_per_env > IMAGE_STEPS:  # (IMAGE_STEPS: why)
            cfg = C.build(preset, [*overrides, f"farm.steps_per_env={IMAGE_STEPS}"])
        torch.manual_seed(cfg.seed)
        algo = learner("ppo", "sync")(cfg, spec, torch.device("cpu"))
        algo.policy.to(DTYPE)  # in place: the optimizer keeps the same parameters (module docstring)
        rng = np.random.default_rng(cfg.seed)
        sample = observation_sampler(observation_space, spec, rng)
        if algo.policy.obs_norm is not None:  # statistics of observations seen before, as mid-run
            algo.policy.obs_norm.update(sample((4096,)))
        T, N = cfg.farm.steps_per_env, cfg.farm.num_tasks * cfg.env.num_envs
        recurrent = isinstance(algo.policy, RecurrentActorCritic)
        if recurrent:  # (a recurrent preset learns whole tasks: policy.seq_len 0, one sequence a sub-env)
            assert cfg.policy.seq_len == 0, "the CleanRL LSTM reference learns whole rollouts"
            rollout = synthetic_recurrent_rollout(algo.policy, spec, sample, T, N, rng)
        else:
            rollout = synthetic_rollout(algo.policy, spec, sample, T, N, rng, DTYPE)
        initial = copy.deepcopy(algo.policy)
        order = torch.Generator()
        order.set_state(algo.generator.get_state())  # the draws `_optimize` is about to make
        perms = [torch.randperm(N if recurrent else T * N, generator=order) for _ in range(cfg.ppo.update_epochs)]
        advantages, returns = compute_gae(rollout, cfg.ppo.gamma, cfg.ppo.gae_lambda)
        algo.observe(rollout, policy_lag=0)
        metrics = algo.update(PROGRESS)
        return Case(
            cfg,
            spec,
            observation_space,
            action_space,
            rollout,
            advantages,
            returns,
            perms,
            initial,
            algo.policy,
            metrics,
        )


def max_difference(pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> tuple[float, str]:
    """The largest |a - b| over (name, a, b) pairs of parameters, and the parameter it is in."""
    return max(((a.detach().reshape(-1) - b.detach().reshape(-1)).abs().max().item(), name) for name, a, b in pairs)


def check_equal(name: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor]], against: str) -> float:
    diff, where = max_difference(pairs)
    print(f"{name} vs {against}: max |difference| of the parameters after one update {diff:.2e} ({where})")
    assert diff <= TOLERANCE, (
        f"{name}: rlfarm's update differs from {against}'s by {diff:.3e} at most (in {where}), more than {TOLERANCE:g}"
    )
    return diff


# ---- CleanRL: its update, written out -----------------------------------------------------------


def cleanrl_gae(r: Rollout, gamma: float, gae_lambda: float) -> tuple[np.ndarray, np.ndarray]:
    """CleanRL's GAE loop (ppo.py), its `next_done` the step's episode end; a truncated episode's
    bootstrap value folded into its last reward, as SB3 does (CleanRL itself drops it)."""
    T = len(r.rewards)
    rewards = r.rewards.astype(np.float64) + gamma * np.where(r.dones, r.final_values, 0.0)
    values = r.values.astype(np.float64)
    advantages = np.zeros_like(values)
    lastgaelam = 0.0
    for t in reversed(range(T)):
        nextnonterminal = 1.0 - r.dones[t]
        nextvalues = r.last_values if t == T - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages.astype(np.float32), returns.astype(np.float32)


def cleanrl_update(case: Case) -> ActorCritic:
    """CleanRL's PPO update (ppo.py, ppo_atari.py, ppo_continuous_action.py) on a copy of the
    network as the update began, with its own Adam (eps 1e-5): per epoch the minibatches of a
    permutation (rlfarm's, where CleanRL shuffles b_inds), the clipped surrogate, advantages
    normalised per minibatch, the value loss 0.5 * max(unclipped, clipped) with clip_vloss else
    0.5 * mse, the entropy bonus, the global gradient norm clipped; the learning rate annealed by
    the fraction of the run left. CleanRL's flattening (obs.reshape((-1,) + shape)) is time-major,
    as rlfarm's."""
    p = case.cfg.ppo
    agent = copy.deepcopy(case.initial)
    optimizer = torch.optim.Adam(agent.parameters(), lr=p.learning_rate, eps=1e-5)
    if p.anneal_lr:
        optimizer.param_groups[0]["lr"] = (1.0 - PROGRESS) * p.learning_rate  # CleanRL's frac * lrnow
    r = case.rollout
    T, N = r.rewards.shape
    batch_size = T * N
    minibatch_size = batch_size // p.num_minibatches
    b_obs = torch.from_numpy(r.obs.reshape(batch_size, *r.obs.shape[2:]))
    b_actions = torch.from_numpy(r.actions.reshape(batch_size, *r.actions.shape[2:]))
    b_logprobs = torch.from_numpy(r.logprobs.reshape(-1))
    b_values = torch.from_numpy(r.values.reshape(-1))
    advantages, returns = cleanrl_gae(r, p.gamma, p.gae_lambda)
    b_advantages = torch.from_numpy(advantages.reshape(-1))
    b_returns = torch.from_numpy(returns.reshape(-1))
    for b_inds in case.perms:
        for start in range(0, batch_size, minibatch_size):
            mb_inds = b_inds[start : start + minibatch_size]
            newlogprob, entropy, newvalue = agent.evaluate(b_obs[mb_inds], b_actions[mb_inds])
            logratio = newlogprob - b_logprobs[mb_inds]
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
            mb_advantages = b_advantages[mb_inds]
            if p.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss1 = -mb_advantages * ratio
            pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - p.clip_coef, 1 + p.clip_coef)
            pg_loss = torch.max(pg_loss1, pg_loss2).mean()
            newvalue = newvalue.view(-1)
            if p.clip_vloss:
                v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                v_clipped = b_values[mb_inds] + torch.clamp(newvalue - b_values[mb_inds], -p.clip_coef, p.clip_coef)
                v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
            else:
                v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - p.ent_coef * entropy_loss + v_loss * p.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), p.max_grad_norm)
            optimizer.step()
        if p.target_kl > 0 and approx_kl > p.target_kl:  # CleanRL's target_kl (None there: 0 here)
            break
    return agent


def cleanrl_lstm_update(case: Case) -> RecurrentActorCritic:
    """CleanRL's LSTM PPO update (ppo_atari_lstm.py), written out: minibatches of whole envs (a
    permutation of the envs, rlfarm's order), each env's rollout replayed step by step from its
    initial state with the state zeroed where an episode starts (`(1.0 - d) * state`, CleanRL's
    get_states), the losses of cleanrl_update; its Adam eps 1e-5, its time-major flattening. The clip
    range is CleanRL's constant one, or annealed by the fraction of the run left as sb3-contrib's
    RecurrentPPO anneals it (`ppo.anneal_clip`; the value clip stays constant, as rlfarm's and SB3's)."""
    p = case.cfg.ppo
    clip = p.clip_coef * ((1.0 - PROGRESS) if p.anneal_clip else 1.0)
    agent = copy.deepcopy(case.initial)
    optimizer = torch.optim.Adam(agent.parameters(), lr=p.learning_rate, eps=1e-5)
    if p.anneal_lr:
        optimizer.param_groups[0]["lr"] = (1.0 - PROGRESS) * p.learning_rate
    r = case.rollout
    T, N = r.rewards.shape
    advantages, returns = cleanrl_gae(r, p.gamma, p.gae_lambda)
    starts = np.zeros((T, N), bool)
    starts[1:] = r.dones[:-1]  # CleanRL's `dones[t]`: obs[t] begins an episode
    envs_per_batch = N // p.num_minibatches
    for envinds in case.perms:
        for start in range(0, N, envs_per_batch):
            mbenvinds = envinds[start : start + envs_per_batch].numpy()
            state = torch.from_numpy(r.states[0][mbenvinds]).to(DTYPE)
            logprobs, entropies, values = [], [], []
            for t in range(T):
                state = state * torch.from_numpy(~starts[t, mbenvinds]).to(DTYPE).unsqueeze(-1)
                out, value, state = agent.step(torch.from_numpy(r.obs[t, mbenvinds]), state)
                dist = policy_distribution(case.spec, out, None if case.spec.discrete else agent.actor_logstd)
                logprob, entropy = log_prob_entropy(case.spec, dist, torch.from_numpy(r.actions[t, mbenvinds]))
                logprobs.append(logprob)
                entropies.append(entropy)
                values.append(value)
            newlogprob, entropy, newvalue = (torch.stack(x).reshape(-1) for x in (logprobs, entropies, values))
            mb = (slice(None), mbenvinds)
            logratio = newlogprob - torch.from_numpy(r.logprobs[mb].reshape(-1))
            ratio = logratio.exp()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
            mb_advantages = torch.from_numpy(advantages[mb].reshape(-1))
            if p.norm_adv:
                mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
            pg_loss = torch.max(-mb_advantages * ratio, -mb_advantages * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()
            mb_returns = torch.from_numpy(returns[mb].reshape(-1))
            if p.clip_vloss:
                mb_values = torch.from_numpy(r.values[mb].reshape(-1))
                v_clipped = mb_values + torch.clamp(newvalue - mb_values, -p.clip_coef, p.clip_coef)
                v_loss = 0.5 * torch.max((newvalue - mb_returns) ** 2, (v_clipped - mb_returns) ** 2).mean()
            else:
                v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
            loss = pg_loss - p.ent_coef * entropy.mean() + v_loss * p.vf_coef
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), p.max_grad_norm)
            optimizer.step()
        if p.target_kl > 0 and approx_kl > p.target_kl:
            break
    return agent


def cleanrl_pairs(case: Case, agent: ActorCritic) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    theirs = dict(agent.named_parameters())
    return [(name, param, theirs[name]) for name, param in case.updated.named_parameters()]


# ---- Stable-Baselines3: its PPO, fed the same batch ---------------------------------------------


class SpacesOnly(gym.Env):
    """An env that is only its spaces: SB3 builds its policy and rollout buffer from them, and
    `train()` never steps it."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        return self.observation_space.sample(), {}

    def step(self, action):
        raise AssertionError("SB3's train() stepped the env")


def _layers(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.Linear | nn.Conv2d)]


def sb3_pairs(network: ActorCritic, policy: nn.Module) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(rlfarm's name, rlfarm's parameter, SB3's parameter) for every parameter of both networks: the
    Nature CNN's convolutions and linear layer, then the action and value heads; for MLPs the pi and
    vf nets with their heads; the Gaussian's log std."""
    if network.encoder is not None:
        ours = [*_layers(network.encoder), *_layers(network.actor), *_layers(network.critic)]
        theirs = [*_layers(policy.features_extractor), policy.action_net, policy.value_net]
    else:
        ours = [*_layers(network.actor), *_layers(network.critic)]
        theirs = [
            *_layers(policy.mlp_extractor.policy_net),
            policy.action_net,
            *_layers(policy.mlp_extractor.value_net),
            policy.value_net,
        ]
    names = {id(param): name for name, param in network.named_parameters()}
    pairs = []
    for a, b in zip(ours, theirs, strict=True):
        # rlfarm's first convolution (PixelConv2d) takes raw pixels with the 1/255 folded into its
        # weights, SB3's takes pixels / 255: the same weights compute the same function.
        assert isinstance(a, type(b)) and a.weight.shape == b.weight.shape, (a, b)
        pairs += [(names[id(a.weight)], a.weight, b.weight), (names[id(a.bias)], a.bias, b.bias)]
    if not network.spec.discrete:
        pairs.append(("actor_logstd", network.actor_logstd, policy.log_std))
    assert len(pairs) == len(list(network.parameters())) == len(list(policy.parameters())), (
        "a parameter of one network has no counterpart in the other"
    )
    return pairs


def env_major(perm: torch.Tensor, T: int, N: int) -> np.ndarray:
    """rlfarm's minibatch order over its time-major flattening (i = t * N + n) as indices into SB3's
    env-major one (swap_and_flatten: j = n * T + t)."""
    t, n = np.divmod(perm.numpy(), N)
    return n * T + t


@functools.cache
def sb3_update(preset: str, vf_coef: float) -> nn.Module:
    """SB3's PPO built with the preset's settings (vf_coef as given), its policy loaded with the
    weights rlfarm's update of the preset began from, its rollout buffer with rlfarm's batch, its
    permutations forced to rlfarm's order, progress as rlfarm's, then one `train()`; returns its
    policy. Cached (the negative control compares another rlfarm update with the same one)."""
    pytest.importorskip("stable_baselines3", reason=SB3_SKIP)
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN
    from stable_baselines3.common.vec_env import DummyVecEnv

    # SB3's own feature extractors, computing in DTYPE: SB3 casts observations to float32 (and images
    # divided by 255) before them, so they get raw values and do that in DTYPE (module docstring).
    class Pixels(NatureCNN):
        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return super().forward(observations.to(DTYPE) / 255.0)

    class Vectors(FlattenExtractor):
        """With rlfarm's observation statistics where the preset normalises (SB3 would apply them in
        VecNormalize, before its buffer: the same function of the same observations)."""

        def __init__(self, observation_space: gym.Space, normalize: nn.Module | None = None):
            super().__init__(observation_space)
            self.normalize = normalize

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            x = super().forward(observations.to(DTYPE))
            return self.normalize(x) if self.normalize is not None else x

    case = rlfarm_update(preset)
    cfg, p, spec = case.cfg, case.cfg.ppo, case.spec
    assert not p.clip_vloss, (
        "SB3 clips the value loss another way (the clipped value alone, not the max "
        "of clipped and unclipped): a preset compared with SB3 needs ppo.clip_vloss = false"
    )
    assert p.target_kl == 0, "SB3 stops early per minibatch at 1.5 x target_kl: compare with ppo.target_kl = 0"
    if spec.is_image:
        nature, layers = C.PolicyConfig(), ("cnn_channels", "cnn_kernels", "cnn_strides")
        assert all(getattr(cfg.policy, k) == getattr(nature, k) for k in layers), "SB3's NatureCNN: Nature CNN only"
        policy_kwargs = {
            "features_extractor_class": Pixels,
            "normalize_images": False,  # Pixels divides
            "features_extractor_kwargs": {"features_dim": cfg.policy.cnn_features},
            "net_arch": [],
        }  # CnnPolicy's own for NatureCNN: heads on the features
    else:
        hidden = list(cfg.policy.hidden_sizes)
        policy_kwargs = {
            "features_extractor_class": Vectors,
            "net_arch": {"pi": hidden, "vf": hidden},
            "features_extractor_kwargs": {"normalize": copy.deepcopy(case.initial.obs_norm)},
            "activation_fn": {"tanh": nn.Tanh, "relu": nn.ReLU}[cfg.policy.activation],
        }
    r = case.rollout
    T, N = r.rewards.shape
    model = SB3PPO(
        "CnnPolicy" if spec.is_image else "MlpPolicy",
        DummyVecEnv([lambda: SpacesOnly(case.observation_space, case.action_space)] * N),
        learning_rate=(lambda left: left * p.learning_rate) if p.anneal_lr else p.learning_rate,
        n_steps=T,
        batch_size=T * N // p.num_minibatches,
        n_epochs=p.update_epochs,
        gamma=p.gamma,
        gae_lambda=p.gae_lambda,
        clip_range=(lambda left: left * p.clip_coef) if p.anneal_clip else p.clip_coef,
        clip_range_vf=None,
        normalize_advantage=p.norm_adv,
        ent_coef=p.ent_coef,
        vf_coef=vf_coef,
        max_grad_norm=p.max_grad_norm,
        target_kl=None,
        policy_kwargs=policy_kwargs,
        device="cpu",
    )
    model.set_logger(Logger(folder=None, output_formats=[]))  # train() records; nothing written
    model.policy.to(DTYPE)  # in place: its optimizer keeps the same parameters
    pairs = sb3_pairs(case.initial, model.policy)
    with torch.no_grad():
        for _, ours, theirs in pairs:
            theirs.copy_(ours.reshape(theirs.shape))

    buffer = model.rollout_buffer
    buffer.observations[:] = r.obs
    buffer.actions[:] = r.actions.reshape(T, N, -1)
    buffer.values[:], buffer.log_probs[:] = r.values, r.logprobs
    # SB3 computes its own advantages and returns, as its collect_rollouts() leaves the buffer: a
    # truncated episode's bootstrap is folded into its last reward (reward + gamma V(final obs)), and
    # episode_starts[t] says the step before t ended an episode.
    buffer.rewards[:] = r.rewards + p.gamma * np.where(r.dones, r.final_values, 0.0)
    buffer.episode_starts[0] = 0.0
    buffer.episode_starts[1:] = r.dones[:-1]
    buffer.full, buffer.pos = True, T
    buffer.compute_returns_and_advantage(torch.from_numpy(r.last_values), r.dones[-1])
    # rlfarm's GAE must not have been handed over: SB3's own targets agree with it (float32 arrays).
    assert np.allclose(buffer.advantages, case.advantages, rtol=0, atol=1e-4), "SB3's advantages differ from rlfarm's"

    with torch.no_grad():  # the weights copied across: both networks compute the same outputs
        obs = torch.from_numpy(r.obs.reshape(T * N, *r.obs.shape[2:])[:16])
        actions = torch.from_numpy(r.actions.reshape(T * N, *spec.action_shape)[:16])
        values, logprob, entropy = model.policy.evaluate_actions(obs, actions)
        for ours, theirs in zip(case.initial.evaluate(obs, actions), (logprob, entropy, values.flatten())):
            assert torch.allclose(ours, theirs, rtol=0, atol=1e-9), "SB3's policy computes other outputs"

    model._current_progress_remaining = 1.0 - PROGRESS  # what SB3 anneals learning rate and clip range by
    orders = iter([env_major(perm, T, N) for perm in case.perms])

    def permutation(n: int) -> np.ndarray:
        assert n == T * N
        return next(orders)

    with mock.patch.object(np.random, "permutation", permutation):  # the rollout buffer's one draw per epoch
        model.train()
    assert next(orders, None) is None, "SB3 drew fewer permutations than rlfarm's epochs"
    return model.policy


# ---- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_every_sync_ppo_preset_names_its_reference(preset):
    cfg = C.build(preset)
    assert cfg.reference in ("sb3", "cleanrl"), (
        f'preset {preset} trains SYNC PPO but names no reference implementation: set reference = "sb3" or '
        f'"cleanrl" (the update its hyper-parameters assume), and tests/test_reference.py checks it'
    )


@pytest.mark.parametrize("preset", [case_of(name) for name in PRESETS])
def test_one_update_equals_the_reference_update(preset):
    """rlfarm's update from the preset's config equals its reference's to TOLERANCE."""
    case = rlfarm_update(preset)
    p = case.cfg.ppo
    assert case.metrics["charts/clip_coef"] == pytest.approx(p.clip_coef * ((1 - PROGRESS) if p.anneal_clip else 1))
    if case.cfg.reference == "sb3":
        check_equal(preset, sb3_pairs(case.updated, sb3_update(preset, p.vf_coef)), "Stable-Baselines3")
    elif case.cfg.reference == "cleanrl":
        if isinstance(case.updated, RecurrentActorCritic):  # (its clip annealed as sb3-contrib's, if asked)
            check_equal(preset, cleanrl_pairs(case, cleanrl_lstm_update(case)), "CleanRL's LSTM PPO")
        else:
            assert not p.anneal_clip, "CleanRL's clip range is constant: a cleanrl preset cannot anneal it"
            check_equal(preset, cleanrl_pairs(case, cleanrl_update(case)), "CleanRL")
    else:
        pytest.fail(f"preset {preset} names no reference")


HALF_MSE_UNCLIPPED = [
    name
    for name in PRESETS
    if (cfg := C.build(name)).reference == "cleanrl" and not cfg.ppo.clip_vloss and not cfg.policy.recurrent
]  # (a recurrent preset: SB3's PPO has no recurrent policy; sb3-contrib's has another architecture)


@pytest.mark.parametrize("preset", [case_of(name) for name in HALF_MSE_UNCLIPPED])
def test_cleanrl_form_equals_sb3_with_half_the_vf_coef(preset):
    """CleanRL's 0.5 * mse at vf_coef is SB3's mse at vf_coef / 2: an independent implementation of
    the same update (the equivalence the issue measured)."""
    case = rlfarm_update(preset)
    check_equal(
        preset,
        sb3_pairs(case.updated, sb3_update(preset, case.cfg.ppo.vf_coef / 2)),
        "Stable-Baselines3 with vf_coef halved",
    )


def test_negative_control_pong_with_cleanrls_value_loss_is_not_sb3():
    """The comparison can fail: the pong preset with CleanRL's half value loss is another update than
    SB3's at the same vf_coef (the SB3 update of the pong test, from the same weights, batch and order)."""
    case, sb3_case = rlfarm_update("pong", ("ppo.vf_loss=half_mse",)), rlfarm_update("pong")
    same_start = [
        (name, a, b) for (name, a), (_, b) in zip(case.initial.named_parameters(), sb3_case.initial.named_parameters())
    ]
    assert max_difference(same_start)[0] == 0 and np.array_equal(case.rollout.obs, sb3_case.rollout.obs)
    assert all(torch.equal(a, b) for a, b in zip(case.perms, sb3_case.perms))
    diff, where = max_difference(sb3_pairs(case.updated, sb3_update("pong", case.cfg.ppo.vf_coef)))
    print(f"pong with vf_loss half_mse vs Stable-Baselines3: max |difference| {diff:.2e} ({where})")
    assert diff > 100 * TOLERANCE, f"half_mse matched SB3's mse to {diff:.2e}: the comparison cannot tell them apart"


# ---- the config keys, in both learners ----------------------------------------------------------


def small(mode: str, *overrides: str) -> C.RunConfig:
    return C.build(
        "cartpole-ppo" if mode == "sync" else "cartpole-appo",
        [
            "env.num_envs=2",
            "farm.num_tasks=1",
            "farm.steps_per_env=32",
            "ppo.num_minibatches=2",
            "ppo.update_epochs=2",
            "policy.hidden_sizes=[16, 16]",
            *overrides,
        ],
    )


def learn(cfg: C.RunConfig, progress: float) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """One update of a fresh learner (same seed, same batch whatever the config) at `progress`."""
    env = make_env(cfg.env.id)
    try:
        spec, space = space_spec(env), env.observation_space
    finally:
        env.close()
    torch.manual_seed(0)
    algo = learner("ppo", cfg.mode)(cfg, spec, torch.device("cpu"))
    rng = np.random.default_rng(0)
    T, N = cfg.farm.steps_per_env, cfg.farm.num_tasks * cfg.env.num_envs
    rollout = synthetic_rollout(algo.policy, spec, observation_sampler(space, spec, rng), T, N, rng)
    algo.observe(rollout, policy_lag=0)
    metrics = {}
    while algo.ready():
        metrics = algo.update(progress)
    return algo.state(), metrics


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_anneal_clip_sets_the_clip_in_force(mode):
    """anneal_clip: the surrogate's clip range is clip_coef x the progress left, logged as
    charts/clip_coef; without it the clip stays clip_coef. At progress 0 the two updates are one."""
    start, metrics = learn(small(mode), 0.0)
    annealed, annealed_metrics = learn(small(mode, "ppo.anneal_clip=true"), 0.0)
    assert metrics["charts/clip_coef"] == annealed_metrics["charts/clip_coef"] == 0.2
    assert all(torch.equal(start[k], annealed[k]) for k in start)
    steps = ("ppo.update_epochs=8", "ppo.learning_rate=0.01")  # enough for ratios past 1 +- 0.08
    constant, metrics = learn(small(mode, *steps), 0.6)
    annealed, annealed_metrics = learn(small(mode, *steps, "ppo.anneal_clip=true"), 0.6)
    assert metrics["charts/clip_coef"] == 0.2 and annealed_metrics["charts/clip_coef"] == pytest.approx(0.2 * 0.4)
    assert annealed_metrics["losses/clipfrac"] > 0, "no ratio reached the clip in force"
    assert any(not torch.equal(constant[k], annealed[k]) for k in constant), "the clip in force changed nothing"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_mse_value_loss_is_half_mse_at_twice_the_vf_coef(mode):
    """vf_loss = "mse" doubles the value loss: bit for bit the update of "half_mse" (the default)
    at twice the vf_coef, in both learners; the value loss logged is twice as large."""
    half, half_metrics = learn(small(mode, "ppo.vf_loss=half_mse", "ppo.vf_coef=1.0"), 0.3)
    mse, mse_metrics = learn(small(mode, "ppo.vf_loss=mse", "ppo.vf_coef=0.5"), 0.3)
    assert all(torch.equal(half[k], mse[k]) for k in half)
    assert mse_metrics["losses/value_loss"] == pytest.approx(2 * half_metrics["losses/value_loss"])
    default, _ = learn(small(mode, "ppo.vf_coef=1.0"), 0.3)
    assert all(torch.equal(half[k], default[k]) for k in half)


def test_the_new_keys_defaults_and_checks():
    cfg = C.build(None)
    assert (cfg.ppo.vf_loss, cfg.ppo.anneal_clip, cfg.reference) == ("half_mse", False, "")
    assert C.build(None, ["reference=sb3", "ppo.vf_loss=mse", "ppo.anneal_clip=true"]).reference == "sb3"
    for override, message in [
        (
            "ppo.vf_loss=huber",
            "ppo.vf_loss must be half_mse (CleanRL: 0.5 * mean((V - R)^2)) or mse "
            "(Stable-Baselines3: mean((V - R)^2)), got 'huber'",
        ),
        ("ppo.anneal_clip=1", "ppo.anneal_clip: expected true or false, got 1"),
        ("reference=sb2", "reference must be sb3, cleanrl, rllib or \"\" (none), got 'sb2'"),
        ("reference=1", "reference: expected a string, got 1"),
    ]:
        with pytest.raises(C.ConfigError) as err:
            C.build(None, [override])
        assert str(err.value) == message and "\n" not in str(err.value)

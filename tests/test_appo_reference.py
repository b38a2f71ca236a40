"""ASYNC PPO (APPO) presets against the implementation they name: RLlib's APPO (`reference = "rllib"`).

RLlib's APPO on Pong (`rllib/tuned_examples/appo/pong-appo.yaml`, "solves Pong in 2.5M timesteps") is
its old API stack, gone from the Ray releases that install beside gymnasium 1.x, so its update is
written out here from ray 2.9.3's source, as tests/test_reference.py writes out CleanRL's:

- `APPOTorchPolicy.loss` (algorithms/appo/appo_torch_policy.py, vtrace=True, use_kl_loss=False):
  V-trace with the *target network* as its target policy and the current network's values;
  is_ratio = clamp(mu / pi_target, 0, 2); the surrogate min(A r, A clamp(r, 1 -+ clip)) with
  r = is_ratio * pi / mu; 0.5 mean((V - vs)^2) x vf_loss_coeff; entropy x entropy_coeff; plain means.
- `vtrace_torch.from_importance_weights` (algorithms/impala/vtrace_torch.py): rho and c clipped at
  1, discounts (1 - terminated) gamma, the recursion from the bootstrap value backwards,
  pg advantages clip_pg_rho (r + gamma vs_{t+1} - V).
- The learner (impala_torch_policy's VTraceOptimizer, multi_gpu_learner_thread's MinibatchBuffer):
  torch's Adam (eps 1e-8), the global gradient norm clipped at grad_clip, each batch learned from
  num_sgd_iter times in a row as one minibatch, the target network a hard copy of the network
  taken after each training step (APPO.after_train_step), so before a new batch's first pass.
- The network (models/torch/visionnet.py for 42x42 frames, filters [[16,4,2],[32,4,2],[256,11,1]]):
  TF "same" padding on every convolution but the last, the last one covering the 11x11 map left,
  logits a 1x1 convolution (Xavier-uniform like every convolution), the value head a linear layer
  on the same 256 features with normc(0.01).

One deliberate difference, the same on both sides here: the value a task's last step bootstraps from
is the learner's V(obs after it) (IMPALA's, TorchBeast's and RLlib's before 2.6), where RLlib 2.9 uses
the acting policy's (VALUES_BOOTSTRAPPED). Batches have terminations only: RLlib reads no truncation.
Both sides compute in float64 from the same weights, batch and lag (module docstring of
tests/test_reference.py says why). Unit tier.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from rlfarm import config as C
from rlfarm.algos import learner
from rlfarm.algos.ppo.policies import ActorCritic
from rlfarm.config.keys import to_dict
from rlfarm.core.rollout import Rollout
from rlfarm.envs import make_env, space_spec
from tests.test_reference import _one_thread_own_rng  # noqa: F401  (autouse: one torch thread, the RNG given back)

TOLERANCE = 1e-8  # max |difference| of any parameter after the batch's passes (float64 both sides)
DTYPE = torch.float64
STEPS = 16  # steps per env of the batch (the preset's 96 cost seconds in float64 for the same arithmetic)


def rllib_presets() -> list[str]:
    return [name for name in C.preset_names() if C.build(name).reference == "rllib"]


def spec_of(cfg: C.RunConfig):
    env = make_env(cfg.env.id, options=to_dict(cfg)["env"])
    try:
        return space_spec(env)
    finally:
        env.close()


def lagged_batch(behaviour: ActorCritic, spec, T: int, N: int, rng: np.random.Generator) -> Rollout:
    """T steps of N envs acted by `behaviour` (an older version than the learner's): random frames,
    its sampled actions and log-probabilities, sparse +-1 rewards, terminations (no truncation)."""
    obs = rng.integers(0, 256, (T + 1, N, *spec.obs_shape), dtype=np.uint8)
    flat = torch.from_numpy(obs[:T].reshape(T * N, *spec.obs_shape))
    with torch.no_grad():
        actions = behaviour.distribution(flat).sample()
        logprobs, _, values = behaviour.evaluate(flat, actions)
    dones = rng.random((T, N)) < 0.05
    return Rollout(
        obs=obs[:T],
        actions=actions.numpy().reshape(T, N),
        logprobs=logprobs.numpy().astype(np.float32).reshape(T, N),
        values=values.numpy().astype(np.float32).reshape(T, N),
        rewards=rng.choice(np.array([-1.0, 0.0, 1.0]), (T, N), p=[0.05, 0.9, 0.05]).astype(np.float32),
        dones=dones,
        final_values=np.zeros((T, N), np.float32),
        last_values=np.zeros(N, np.float32),
        last_obs=obs[T],
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
    )


def perturbed(network: ActorCritic, scale: float, seed: int) -> ActorCritic:
    """A copy of `network` a few updates away: every weight moved by noise of `scale` x its own std."""
    other = copy.deepcopy(network)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * scale * (p.std() if p.numel() > 1 else 1))
    return other


def rlfarm_passes(preset: str, overrides: tuple[str, ...] = ()):
    """The preset's APPO learner, its network in float64, after the passes it makes over one batch
    acted `lag` versions ago; also the network it began from and the batch."""
    cfg = C.build(preset, [f"farm.steps_per_env={STEPS}", "async.results_per_update=1", *overrides])
    spec = spec_of(cfg)
    torch.manual_seed(cfg.seed)
    algo = learner("ppo", "async")(cfg, spec, torch.device("cpu"))
    algo.policy.to(DTYPE)
    if algo.target is not None:
        algo.target.to(DTYPE)
    initial = copy.deepcopy(algo.policy)
    behaviour = perturbed(initial, 0.05, seed=cfg.seed)
    rollout = lagged_batch(behaviour, spec, STEPS, cfg.env.num_envs, np.random.default_rng(cfg.seed))
    algo.observe(rollout, policy_lag=3)
    passes = 0
    while algo.ready():
        metrics = algo.update(0.5)
        passes += 1
    return cfg, initial, algo.policy, rollout, passes, metrics


# ---- RLlib's update, written out -----------------------------------------------------------------


def rllib_vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho=1.0, clip_pg_rho=1.0):
    """vtrace_torch.from_importance_weights, (T, B) tensors: vs and pg advantages."""
    rhos = torch.exp(log_rhos)
    clipped_rhos = torch.clamp(rhos, max=clip_rho)
    cs = torch.clamp(rhos, max=1.0)
    values_t_plus_1 = torch.cat([values[1:], bootstrap_value[None]], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
    vs_minus_v_xs = []
    acc = torch.zeros_like(bootstrap_value)
    for t in reversed(range(len(discounts))):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs_minus_v_xs.append(acc)
    vs_minus_v_xs = torch.stack(vs_minus_v_xs[::-1])
    vs = vs_minus_v_xs + values
    vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value[None]], dim=0)
    clipped_pg_rhos = torch.clamp(rhos, max=clip_pg_rho)
    pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)
    return vs.detach(), pg_advantages.detach()


def rllib_update(cfg: C.RunConfig, initial: ActorCritic, rollout: Rollout, passes: int) -> ActorCritic:
    """RLlib 2.9.3's APPO learner on one batch: the target network copied from the network as the
    batch comes in, then `passes` gradient steps on the whole batch (module docstring)."""
    p = cfg.ppo
    model = copy.deepcopy(initial)
    target_model = copy.deepcopy(model).requires_grad_(False)  # after_train_step's hard copy (tau 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=p.learning_rate)  # RLlib: torch's eps 1e-8
    T, N = rollout.rewards.shape
    obs = torch.from_numpy(rollout.obs.reshape(T * N, *rollout.obs.shape[2:]))
    actions = torch.from_numpy(rollout.actions.reshape(-1))
    behaviour_logp = torch.from_numpy(rollout.logprobs.astype(np.float64)).reshape(T, N)
    rewards = torch.from_numpy(rollout.rewards.astype(np.float64))
    discounts = (1.0 - torch.from_numpy(rollout.dones.astype(np.float64))) * p.gamma
    last_obs = torch.from_numpy(rollout.last_obs)
    for _ in range(passes):
        dist = model.distribution(obs)
        actions_logp = dist.log_prob(actions).reshape(T, N)
        entropy = dist.entropy().reshape(T, N)
        values = model.get_value(obs).reshape(T, N)
        with torch.no_grad():
            old_policy_actions_logp = target_model.distribution(obs).log_prob(actions).reshape(T, N)
            bootstrap_value = model.get_value(last_obs)  # (the learner's: module docstring)
        vs, pg_advantages = rllib_vtrace(
            old_policy_actions_logp - behaviour_logp, discounts, rewards, values.detach(), bootstrap_value
        )
        is_ratio = torch.clamp(torch.exp(behaviour_logp - old_policy_actions_logp), 0.0, 2.0)
        logp_ratio = is_ratio * torch.exp(actions_logp - behaviour_logp)
        surrogate_loss = torch.min(
            pg_advantages * logp_ratio,
            pg_advantages * torch.clamp(logp_ratio, 1 - p.clip_coef, 1 + p.clip_coef),
        )
        mean_policy_loss = -torch.mean(surrogate_loss)
        mean_vf_loss = 0.5 * torch.mean(torch.pow(values - vs, 2.0))
        mean_entropy = torch.mean(entropy)
        total_loss = mean_policy_loss + mean_vf_loss * p.vf_coef - mean_entropy * p.ent_coef
        optimizer.zero_grad()
        total_loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), p.max_grad_norm)
        optimizer.step()
    return model


def max_difference(a: nn.Module, b: nn.Module) -> tuple[float, str]:
    theirs = dict(b.named_parameters())
    return max(((param - theirs[name]).abs().max().item(), name) for name, param in a.named_parameters())


# ---- the tests --------------------------------------------------------------------------------------


def test_an_rllib_preset_ships():
    assert "pong-appo" in rllib_presets(), "pong-appo follows RLlib's APPO: it names reference = rllib"


@pytest.mark.parametrize("preset", rllib_presets())
def test_the_preset_is_rllibs_recipe(preset):
    """What the written-out update assumes of the preset: RLlib's loss settings."""
    cfg = C.build(preset)
    p = cfg.ppo
    assert cfg.mode == "async" and p.vtrace and p.clip_to == "target" and p.is_ratio_clip == 2.0
    assert (p.rho_bar, p.c_bar, p.gae_lambda) == (1.0, 1.0, 1.0), "RLlib's V-trace: rho and c clipped at 1, no lambda"
    assert (p.update_epochs, p.num_minibatches, p.buffer_batches) == (1, 1, 1), "each batch whole, passes in a row"
    assert not p.norm_adv and not p.clip_vloss and p.vf_loss == "half_mse" and not p.anneal_lr
    assert p.adam_eps == 1e-8 and p.target_update_batches == 1


@pytest.mark.parametrize("preset", rllib_presets())
def test_one_batch_equals_rllibs_update(preset):
    """A batch acted 3 versions ago, learned from in the preset's passes: rlfarm's network ends where
    RLlib's written-out learner ends, from the same weights."""
    cfg, initial, updated, rollout, passes, metrics = rlfarm_passes(preset)
    assert passes == cfg.ppo.batch_passes >= 2, "the second pass is the one that clips around the target network"
    reference = rllib_update(cfg, initial, rollout, passes)
    moved, _ = max_difference(updated, initial)
    diff, where = max_difference(updated, reference)
    print(f"{preset} vs RLlib's APPO: moved {moved:.2e}, max |difference| {diff:.2e} ({where})")
    assert moved > 1e-4, "the update moved nothing: the comparison would prove nothing"
    assert diff <= TOLERANCE, f"rlfarm's APPO differs from RLlib's by {diff:.3e} (in {where})"
    assert metrics["losses/clipfrac"] > 0, "no sample reached the clip: the target network's clip went untested"


@pytest.mark.parametrize("clip_to", ["behaviour", "proximal"])
def test_negative_control_another_clip_is_not_rllibs(clip_to):
    """The comparison can fail: clipping around the acting policy or the proximal network (and V-trace
    targets from the current network) is another update than RLlib's on the same batch."""
    cfg, initial, updated, rollout, passes, _ = rlfarm_passes("pong-appo", (f"ppo.clip_to={clip_to}",))
    diff, where = max_difference(updated, rllib_update(cfg, initial, rollout, passes))
    assert diff > 1e3 * TOLERANCE, f"clip_to={clip_to} matched RLlib's update to {diff:.2e} ({where})"


class RLlibVisionNet(nn.Module):
    """models/torch/visionnet.py for 42x42x4 frames, vf_share_layers (its default), written out:
    SlimConv2d = ZeroPad2d(same_padding) + Conv2d + ReLU, the last filter unpadded, logits a 1x1
    convolution, the value a linear layer on the squeezed 256 features."""

    def __init__(self, actions: int, obs_scale: float):
        super().__init__()
        self.obs_scale = obs_scale
        self.convs = nn.Sequential(
            nn.ZeroPad2d((1, 1, 1, 1)),  # same_padding((42, 42), 4, 2)
            nn.Conv2d(4, 16, 4, 2),
            nn.ReLU(),
            nn.ZeroPad2d((1, 2, 1, 2)),  # same_padding((21, 21), 4, 2)
            nn.Conv2d(16, 32, 4, 2),
            nn.ReLU(),
            nn.Conv2d(32, 256, 11, 1),
            nn.ReLU(),
        )
        self.logits = nn.Conv2d(256, actions, 1, 1)
        self.value_branch = nn.Linear(256, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.convs(obs.to(DTYPE).permute(0, 3, 1, 2) / self.obs_scale)  # RLlib's NHWC frames
        return self.logits(x).squeeze(3).squeeze(2), self.value_branch(x.squeeze(3).squeeze(2)).squeeze(1)


@pytest.mark.parametrize("preset", rllib_presets())
def test_the_network_is_rllibs_vision_net(preset):
    """The preset's network computes RLlib's vision network's logits and value from the same weights
    on the same frames (padding, kernel 11, no hidden linear layer), and is initialised as RLlib's:
    Xavier-uniform convolutions and logits (bound sqrt(6 / (fan_in + fan_out))), normc(0.01) value."""
    cfg = C.build(preset)
    spec = spec_of(cfg)
    torch.manual_seed(0)
    ours = ActorCritic(spec, cfg.policy).to(DTYPE)
    convs = [m for m in ours.encoder.convs if isinstance(m, nn.Conv2d)]
    for conv in [*convs, ours.actor[0]]:
        fan_in, fan_out = conv.weight[0].numel(), conv.weight.shape[0] * conv.weight[0, 0].numel()
        bound = (6 / (fan_in + fan_out)) ** 0.5
        assert conv.weight.abs().max() <= bound and conv.weight.abs().max() > 0.9 * bound
        assert not conv.bias.any()
    assert ours.critic[0].weight.norm().item() == pytest.approx(0.01) and not ours.critic[0].bias.any()
    theirs = RLlibVisionNet(spec.action_dim, cfg.policy.obs_scale).to(DTYPE)
    with torch.no_grad():
        for a, b in zip(convs, [m for m in theirs.convs if isinstance(m, nn.Conv2d)], strict=True):
            b.weight.copy_(a.weight), b.bias.copy_(a.bias)
        theirs.logits.weight.copy_(ours.actor[0].weight[:, :, None, None]), theirs.logits.bias.copy_(ours.actor[0].bias)
        theirs.value_branch.weight.copy_(ours.critic[0].weight), theirs.value_branch.bias.copy_(ours.critic[0].bias)
        frames = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, 42, 42, 4), dtype=np.uint8))
        chw = frames if spec.image_layout == "HWC" else frames.permute(0, 3, 1, 2).contiguous()
        logits, value = ours._heads(chw)
        their_logits, their_value = theirs(frames)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert torch.allclose(logits, their_logits, rtol=0, atol=1e-9) and torch.allclose(value, their_value, atol=1e-9)

"""The learners alone, for every algorithm in the registry (no Redis, no Celery): one update changes
the parameters with finite losses; checkpoint -> restore -> update equals an uninterrupted update;
the network follows the observation space (MLP for vectors, CNN for uint8 images)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest
import torch
from torch import nn

from rlfarm import config as C
from rlfarm.algos import learner, names
from rlfarm.core.rollout import collect
from rlfarm.envs import describe, make_vector_env
from rlfarm.errors import EnvError
from rlfarm.nn.acting import Actor
from rlfarm.nn.layers import NatureCNN, cnn_layers

ENVS = {"vector": "CartPole-v1", "image": "tests.tiny_envs:image", "image-hwc": "tests.tiny_envs:image_hwc"}
# The same kinds with Box actions, for the algorithms that cannot act in ENVS (SAC).
BOX_ENVS = {"vector": "Pendulum-v1", "image": "tests.tiny_envs:image_box", "image-hwc": "tests.tiny_envs:image_box_hwc"}
# Small and quick, for whichever of these keys an algorithm's section has: learning starts at once,
# small batches and networks, two short epochs.
SMALL = {
    "learning_starts": 0,
    "batch_size": 32,
    "buffer_size": 4096,
    "replay_ratio": 0.05,
    "num_minibatches": 2,
    "update_epochs": 2,
}


def overrides(algo: str) -> list[str]:
    fields = {f.name for f in dataclasses.fields(C.ALGORITHMS[algo])}
    return [f"{algo}.{key}={value}" for key, value in SMALL.items() if key in fields] + [
        "policy.cnn_features=32",
        "policy.hidden_sizes=[32, 32]",
    ]


@functools.cache
def env_for(algo: str, kind: str) -> str:
    """The env of this kind the algorithm can act in: ENVS' (discrete actions) unless its own checks
    refuse them, then BOX_ENVS'."""
    try:
        C.ALGORITHMS[algo].check_spaces(describe(ENVS[kind]))
        return ENVS[kind]
    except C.ConfigError:
        return BOX_ENVS[kind]


def make(algo: str, env: str, seed: int = 0, mode: str | None = None, extra: tuple[str, ...] = ()):
    mode = mode or next(iter(C.ALGORITHMS[algo].modes))
    cfg = C.build(
        None,
        [
            f"algo={algo}",
            f"mode={mode}",
            f"env.id={env}",
            "env.num_envs=2",
            "farm.num_tasks=1",
            "farm.steps_per_env=64",
            *overrides(algo),
            *extra,
        ],
        seed=seed,
    )
    spec = describe(env)
    torch.manual_seed(seed)
    return learner(algo, mode)(cfg, spec, torch.device("cpu")), spec


def rollout_for(algorithm, env: str, seed: int):
    """A real rollout of 64 steps x 2 envs, acted by the algorithm's own actor with its options."""
    cls = type(algorithm)
    actor = cls.actor_snapshot(algorithm.policy).with_options(**algorithm.acting(0.0))
    return collect(actor, make_vector_env(env, 2), 64, [seed, seed + 1], seed, keep_next_obs=cls.collect_next_obs)


def train_once(algorithm, rollout) -> dict[str, float]:
    algorithm.observe(rollout, policy_lag=0)
    assert algorithm.ready()
    metrics = {}
    while algorithm.ready():
        metrics = algorithm.update(0.25)
    return metrics


def params(algorithm) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in algorithm.state().items()}


# Every learner: each algorithm in each mode it runs in (PPO's ASYNC learner is APPO).
LEARNERS = [(algo, mode) for algo in names() for mode in C.ALGORITHMS[algo].modes]
CASES = [(algo, mode, kind) for algo, mode in LEARNERS for kind in ENVS]


@pytest.mark.parametrize("algo, mode, kind", CASES)
def test_one_update_changes_parameters_with_finite_losses(algo, mode, kind):
    env = env_for(algo, kind)
    algorithm, _ = make(algo, env, mode=mode)
    before = params(algorithm)
    metrics = train_once(algorithm, rollout_for(algorithm, env, seed=3))
    assert set(type(algorithm).loss_keys) <= set(metrics)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    after = algorithm.state()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "an update left every parameter as it was"


@pytest.mark.parametrize("algo, mode, kind", CASES)
def test_checkpoint_restore_update_is_bit_identical(algo, mode, kind):
    env = env_for(algo, kind)
    first, second = rollout_for(make(algo, env, seed=1, mode=mode)[0], env, seed=5), None
    whole, _ = make(algo, env, mode=mode)
    train_once(whole, first)
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}  # as written to the file: not views of live state
    second = rollout_for(whole, env, seed=9)
    train_once(whole, second)

    resumed, _ = make(algo, env, seed=42, mode=mode)  # other initial weights: all of them must come from the checkpoint
    resumed.restore(tensors, state)
    train_once(resumed, second)
    a, b = whole.state(), resumed.state()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("algo", names())
def test_network_follows_the_observation_space(algo):
    cls = learner(algo)
    policy_cfg = C.PolicyConfig()
    vector = cls.build_network(describe(env_for(algo, "vector")), policy_cfg)
    assert not any(isinstance(m, nn.Conv2d) for m in vector.modules())
    actor = cls.actor_snapshot(vector)  # MLPs act in numpy on workers: the actor holds no torch module
    assert isinstance(actor, Actor) and not any(isinstance(v, nn.Module) for v in vars(actor).values())

    for kind in ("image", "image-hwc"):
        spec = describe(env_for(algo, kind))
        assert spec.is_image and spec.obs_dtype == "uint8"
        image = cls.build_network(spec, policy_cfg)
        assert isinstance(image.encoder, NatureCNN)
        assert isinstance(cls.actor_snapshot(image), Actor)  # ONNX Runtime or torch on the CPU (tests/test_policy.py)
        # A 16x16 image is too small for the Nature CNN's 8x8/4 kernels: the small default applies.
        assert cnn_layers(spec, policy_cfg) == [(16, 3, 1), (32, 3, 1)]
        obs = np.random.default_rng(0).integers(0, 256, (3, *spec.obs_shape), dtype=np.uint8)
        actor = cls.actor_snapshot(image)
        action, _, value = actor.act(obs, np.random.default_rng(0), deterministic=True)
        assert action.shape == (3, *spec.action_shape) and value.shape == (3,) and value.dtype == np.float32


def test_an_atari_sized_image_gets_the_nature_cnn():
    from rlfarm.envs import SpaceSpec

    spec = SpaceSpec(84 * 84 * 4, True, 6, obs_shape=(84, 84, 4), obs_dtype="uint8")
    assert spec.image_layout == "HWC"
    assert cnn_layers(spec, C.PolicyConfig()) == [(32, 8, 4), (64, 4, 2), (64, 3, 1)]


def test_rollouts_keep_uint8_observations():
    algorithm, spec = make("dqn", ENVS["image"])
    r = rollout_for(algorithm, ENVS["image"], seed=2)
    assert r.obs.dtype == np.uint8 and r.obs.shape == (64, 2, *spec.obs_shape)
    assert r.next_obs.dtype == np.uint8
    assert algorithm.replay.obs.dtype == np.uint8


def test_float64_observations_are_cast_once_to_float32():
    env = "tests.tiny_envs:float64"
    assert make_vector_env(env, 2).observation_space.dtype == np.float64  # the premise
    algorithm, _ = make("ppo", env)
    r = rollout_for(algorithm, env, seed=2)
    assert r.obs.dtype == np.float32 and r.actions.dtype == np.float32


def test_an_observation_space_rlfarm_cannot_act_on_is_one_clear_error():
    with pytest.raises(EnvError, match=r"observation space Dict\(.*is not supported.*Box observations"):
        describe("tests.tiny_envs:dict_obs")


def test_each_algorithm_checks_its_own_config_and_spaces():
    with pytest.raises(C.ConfigError, match="dqn.tau must be in"):
        C.build("cartpole-dqn", ["dqn.tau=0"])
    with pytest.raises(C.ConfigError, match="needs a discrete action space"):
        C.ALGORITHMS["dqn"].check_spaces(describe("Pendulum-v1"))
    with pytest.raises(C.ConfigError, match="algo 'dqn' cannot run in --mode sync"):
        C.ALGORITHMS["dqn"].check_mode("sync")
    C.ALGORITHMS["ppo"].check_mode("async")  # APPO
    with pytest.raises(C.ConfigError, match="unknown algo 'dqnn' \\(did you mean dqn\\?\\)"):
        C.build("cartpole-dqn", ["algo=dqnn"])


@pytest.mark.parametrize("mode", list(C.ALGORITHMS["ppo"].modes))
def test_ppo_learners_take_continuous_actions(mode):
    """SYNC PPO and APPO on a Box action space (Pendulum): finite losses, changed parameters."""
    algorithm, _ = make("ppo", "Pendulum-v1", mode=mode)
    before = params(algorithm)
    metrics = train_once(algorithm, rollout_for(algorithm, "Pendulum-v1", seed=4))
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert any(not torch.equal(before[k], v) for k, v in algorithm.state().items())


@pytest.mark.parametrize(
    "target",
    [
        (),
        ("ppo.clip_to=target", "ppo.target_update_batches=3"),
        ("ppo.clip_to=target", "ppo.target_update_batches=3", "policy.recurrent=lstm", "policy.seq_len=16"),
    ],
    ids=["", "target", "target-lstm"],
)
def test_appos_circular_buffer_learns_each_batch_its_passes_round_robin_and_resumes_bit_identically(target):
    """ppo.buffer_batches = 3, ppo.batch_passes = 2 (RLlib's circular buffer, in small): the first three
    batches are learned from as they come, then each again in turn; every batch gets exactly 2 updates.
    A learner checkpointed with a batch still in its buffer goes on exactly as one never stopped, with
    its target network (clip_to = "target") and the batches it has seen since its copy; a recurrent
    one's batches keep the states their sequences start from."""
    env = "CartPole-v1"

    def appo(seed: int = 0):
        cfg = C.build(
            None,
            [
                "algo=ppo",
                "mode=async",
                f"env.id={env}",
                "env.num_envs=2",
                "farm.steps_per_env=64",
                "ppo.num_minibatches=2",
                "ppo.update_epochs=1",
                "ppo.buffer_batches=3",
                "ppo.batch_passes=2",
                "async.results_per_update=1",
                "policy.hidden_sizes=[32, 32]",
                *target,
            ],
            seed=seed,
        )
        torch.manual_seed(seed)
        return learner("ppo", "async")(cfg, describe(env), torch.device("cpu"))

    def feed(algorithm, rollout) -> int:
        algorithm.observe(rollout, policy_lag=0)
        updates = 0
        while algorithm.ready():
            algorithm.update(0.1)
            updates += 1
        return updates

    whole = appo()
    rollouts = [rollout_for(whole, env, seed=s) for s in range(6)]
    assert [feed(whole, r) for r in rollouts[:4]] == [1, 1, 4, 1]
    tensors, state = whole.checkpoint()
    tensors = {k: v.clone() for k, v in tensors.items()}
    if target:  # the target is a copy from before the last update: it must travel in the checkpoint
        policy, copy = whole.policy.state_dict(), whole.target.state_dict()
        assert any(not torch.equal(policy[k], copy[k]) for k in policy)
    assert [feed(whole, r) for r in rollouts[4:]] == [1, 4]  # 12 updates for 6 batches
    assert whole.versions_per_result() == 2

    resumed = appo(seed=42)
    resumed.restore(tensors, state)  # batch 3 waits in the buffer for its second pass
    assert [feed(resumed, r) for r in rollouts[4:]] == [1, 4]
    a, b = whole.state(), resumed.state()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(C.ConfigError, match="ASYNC"):
        C.build(None, ["algo=ppo", "mode=sync", "ppo.batch_passes=2"])


@pytest.mark.parametrize("mode", list(C.ALGORITHMS["ppo"].modes))
@pytest.mark.parametrize("kind", ["vector", "image"])
@pytest.mark.parametrize("seed", [3, 4])
def test_a_bf16_update_follows_the_fp32_update_on_a_fixed_batch(mode, kind, seed):
    """ppo.precision = "bf16" (the network's layers under bf16 autocast, the loss in float32): on the
    same batch and weights, the forward's log-probabilities and values are fp32's to bf16's precision,
    and the update moves the weights (kept float32) the way fp32's does."""
    env = ENVS[kind]
    fp32, spec = make("ppo", env, seed, mode)
    bf16, _ = make("ppo", env, seed, mode, extra=("ppo.precision=bf16",))
    start = params(fp32)
    assert all(torch.equal(start[k], v) for k, v in params(bf16).items())
    batch = rollout_for(fp32, env, seed)
    obs = torch.as_tensor(batch.obs.reshape(-1, *batch.obs.shape[2:]))
    actions = torch.as_tensor(batch.actions.reshape(-1))
    with torch.no_grad():
        want = fp32.policy.evaluate(obs, actions)
        got = bf16.policy.evaluate(obs, actions, autocast=torch.bfloat16)
    for x, y in zip(got, want):
        assert x.dtype == torch.float32
        torch.testing.assert_close(x, y, rtol=0.02, atol=0.02)
    assert not torch.equal(got[2], want[2]), "the values were not computed in bf16"
    steps = {}
    for name, algorithm in (("fp32", fp32), ("bf16", bf16)):
        metrics = train_once(algorithm, batch)
        assert all(math.isfinite(v) for k, v in metrics.items() if k != "losses/explained_variance")
        after = params(algorithm)
        assert all(v.dtype == start[k].dtype for k, v in after.items())
        steps[name] = torch.cat(
            [(after[k] - start[k]).flatten().double() for k in start if start[k].is_floating_point()]
        )
    cosine = torch.nn.functional.cosine_similarity(steps["fp32"], steps["bf16"], dim=0)
    assert cosine > 0.9, cosine
    assert 0.8 < steps["bf16"].norm() / steps["fp32"].norm() < 1.25


@pytest.mark.process  # inductor compiles in processes of its own
@pytest.mark.parametrize("mode", list(C.ALGORITHMS["ppo"].modes))
def test_a_compiled_update_is_the_eager_update(mode):
    """ppo.compile = "default" (the network's layers in the minibatches under torch.compile, forward
    and backward): from the same weights on the same batch, the update lands on the eager update's
    weights to float32 rounding, and what is published has the eager module's names."""
    env = ENVS["image"]  # a CNN: where compiling pays
    eager, _ = make("ppo", env, 5, mode)
    compiled, _ = make("ppo", env, 5, mode, extra=("ppo.compile=default",))
    assert compiled.layers is not None and eager.layers is None
    batch = rollout_for(eager, env, 5)
    for algorithm in (eager, compiled):
        metrics = train_once(algorithm, batch)
        assert all(math.isfinite(v) for k, v in metrics.items() if k != "losses/explained_variance")
    want, got = params(eager), params(compiled)
    assert got.keys() == want.keys()
    moved = max(float((want[k] - v).abs().max()) for k, v in params(make("ppo", env, 5, mode)[0]).items())
    assert moved > 1e-4  # the update moved the weights, so agreeing below says something
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-5)
    with pytest.raises(C.ConfigError, match="ppo.compile"):
        C.build(None, ["algo=ppo", "ppo.compile=fast"])

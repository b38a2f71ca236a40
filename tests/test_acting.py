"""Acting without torch (rlfarm.algos.acting, rlfarm.nn.acting): a version's tensors read as numpy
arrays make the actor a worker acts an MLP policy with, action for action the one built from the torch
network the trainer published, for every algorithm, a group of policies, float16 versions and
normalised observations; a worker process acting such a run never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfarm.algos import learner, network_for
from rlfarm.algos.acting import acts_without_torch, numpy_actor
from rlfarm.config import PolicyConfig
from rlfarm.core import codec
from rlfarm.envs.spaces import space_spec_of
from rlfarm.errors import StateMismatch
from rlfarm.local.cluster import LocalCluster
from tests.conftest import ROOT, WORKER_ENV, read_summary, train_on

DISCRETE = space_spec_of(gym.spaces.Box(-1.0, 1.0, (5,)), gym.spaces.Discrete(4))
# Asymmetric bounds, per dimension: the actors' scale and bias are checked too.
BOX = space_spec_of(gym.spaces.Box(-1.0, 1.0, (5,)), gym.spaces.Box(np.array([-2.0, 0.0]), np.array([1.0, 3.0])))
CASES = [("ppo", DISCRETE), ("ppo", BOX), ("dqn", DISCRETE), ("sac", BOX), ("td3", BOX)]


def _published(algo, spec, config, wire="float32", seed=0):
    """A network with weights and observation statistics far from their initial values, as the bytes
    a trainer publishes (codec.encode_policy of its wire state)."""
    torch.manual_seed(seed)
    net = network_for(algo, spec, config)
    with torch.no_grad():
        for name, value in net.state_dict().items():
            if name.endswith("obs_norm.var"):
                value.copy_(torch.rand_like(value) * 4 + 0.1)
            elif value.dtype.is_floating_point:
                value.add_(torch.randn_like(value) * 0.3)
    return codec.encode_policy(codec.wire_state(net.state_dict(), wire), {"version": "1"})


def _torch_actor(algo, spec, config, blob):
    """The actor as a worker built it before: the version's tensors loaded into the run's network."""
    net = network_for(algo, spec, config)
    net.load_state_dict(codec.decode_policy(blob)[0])
    return learner(algo).actor_snapshot(net)


def _assert_acts_alike(a, b, obs, mask=None):
    for deterministic in (True, False):
        kwargs = {} if mask is None else {"mask": mask}
        got = a.act(obs, np.random.default_rng(7), deterministic, **kwargs)
        want = b.act(obs, np.random.default_rng(7), deterministic, **kwargs)
        for x, y in zip(got, want):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.value(obs), b.value(obs))


@pytest.mark.unit
@pytest.mark.parametrize("wire", ["float32", "float16"])
@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("algo,spec", CASES, ids=[f"{a}-{'discrete' if s.discrete else 'box'}" for a, s in CASES])
def test_a_version_read_as_numpy_acts_exactly_as_the_network_it_was_loaded_into(algo, spec, normalize, wire):
    config = PolicyConfig(hidden_sizes=(32, 16), activation="relu", normalize_obs=normalize)
    blob = _published(algo, spec, config, wire)
    state, _ = codec.decode_policy(blob, arrays="numpy")
    assert all(isinstance(v, np.ndarray) for v in state.values())
    obs = (np.random.default_rng(1).standard_normal((9, spec.obs_dim)) * 3).astype(np.float32)
    _assert_acts_alike(numpy_actor(algo, spec, config, state), _torch_actor(algo, spec, config, blob), obs)


@pytest.mark.unit
def test_a_group_of_policies_acts_from_numpy_as_from_its_networks():
    pytest.importorskip("mpe2", reason='needs mpe2 (the multiagent extra: pip install -e ".[multiagent]")')
    from rlfarm.envs import make_vector_env, space_spec

    game = make_vector_env("mpe2/simple_adversary_v3", 3, options={"policy_map": ("adversary_*=red", "agent_*=blue")})
    spec = space_spec(game)
    game.close()
    assert spec.policies == ("red", "blue") and acts_without_torch(spec)
    config = PolicyConfig(hidden_sizes=(16,), activation="tanh", normalize_obs=True)
    blob = _published("ppo", spec, config, "float16")
    state, _ = codec.decode_policy(blob, arrays="numpy")
    obs = np.random.default_rng(2).standard_normal((6, spec.obs_dim)).astype(np.float32)
    _assert_acts_alike(numpy_actor("ppo", spec, config, state), _torch_actor("ppo", spec, config, blob), obs)


@pytest.mark.unit
def test_masked_actions_and_acting_options_are_the_same_from_numpy():
    config = PolicyConfig(hidden_sizes=(8,))
    mask = np.zeros((9, 4), bool)
    mask[:, 1] = mask[::2, 3] = True
    obs = np.random.default_rng(3).standard_normal((9, 5)).astype(np.float32)
    for algo in ("ppo", "dqn"):
        blob = _published(algo, DISCRETE, config)
        ours = numpy_actor(algo, DISCRETE, config, codec.decode_policy(blob, arrays="numpy")[0])
        theirs = _torch_actor(algo, DISCRETE, config, blob)
        if algo == "dqn":
            ours, theirs = ours.with_options(epsilon=0.5), theirs.with_options(epsilon=0.5)
        _assert_acts_alike(ours, theirs, obs, mask)
        assert mask[np.arange(9), ours.act(obs, np.random.default_rng(0), False, mask=mask)[0]].all()
    blob = _published("td3", BOX, config)
    ours = numpy_actor("td3", BOX, config, codec.decode_policy(blob, arrays="numpy")[0]).with_options(noise=0.2)
    _assert_acts_alike(ours, _torch_actor("td3", BOX, config, blob).with_options(noise=0.2), obs)


@pytest.mark.unit
def test_numpy_and_torch_reads_of_a_blob_digest_alike_and_bfloat16_is_read_with_torch():
    state = {
        "a": torch.randn(3, 4),
        "b": torch.randn(2).half(),
        "c": torch.randn(5, dtype=torch.float64),
        "d": torch.arange(3),
        "e": torch.zeros(0),
    }
    blob = codec.encode_policy(state, {"version": "3"})
    arrays, meta = codec.decode_policy(blob, arrays="numpy")
    assert {k: v.dtype.name for k, v in arrays.items()} == {
        "a": "float32",
        "b": "float16",
        "c": "float64",
        "d": "int64",
        "e": "float32",
    }
    assert codec.tensor_digest(arrays) == codec.tensor_digest(state) == meta["sha256"]
    tampered = bytearray(blob)
    tampered[-1] ^= 1  # the last byte of a tensor
    with pytest.raises(codec.CodecError, match="checksum mismatch"):
        codec.decode_policy(bytes(tampered), arrays="numpy")
    bf16 = codec.encode_policy({"w": torch.randn(2, 2).bfloat16()}, {"version": "1"})
    assert codec.decode_policy(bf16, arrays="numpy")[0]["w"].dtype == torch.bfloat16


@pytest.mark.unit
def test_tensors_of_another_network_are_refused_by_name_and_shape():
    config = PolicyConfig(hidden_sizes=(32, 16))
    state, _ = codec.decode_policy(_published("ppo", DISCRETE, config), arrays="numpy")
    with pytest.raises(StateMismatch, match=r"tensor 'actor.0.weight' has shape \[32, 5\], the network's is \[64, 5\]"):
        numpy_actor("ppo", DISCRETE, PolicyConfig(hidden_sizes=(64,)), state)
    with pytest.raises(StateMismatch, match="no tensor 'q.0.weight'"):
        numpy_actor("dqn", DISCRETE, config, state)
    with pytest.raises(StateMismatch, match="no obs_norm statistics"):
        numpy_actor("ppo", DISCRETE, PolicyConfig(hidden_sizes=(32, 16), normalize_obs=True), state)


@pytest.mark.process
def test_acting_from_a_version_imports_no_torch(tmp_path):
    """What a worker's pool process runs for an MLP run: its preload, a version checked from its bytes,
    the actor, acting; for every algorithm."""
    config = PolicyConfig(hidden_sizes=(8,), normalize_obs=True)
    for algo, spec in CASES:
        (tmp_path / f"{algo}-{spec.discrete}.safetensors").write_bytes(_published(algo, spec, config))
    script = f"""
import sys
from pathlib import Path
import gymnasium as gym
import numpy as np
from rlfarm.worker import hooks
hooks._preload()
from rlfarm.algos.acting import numpy_actor
from rlfarm.config import PolicyConfig
from rlfarm.core import codec
from rlfarm.envs.spaces import space_spec_of
DISCRETE = space_spec_of(gym.spaces.Box(-1.0, 1.0, (5,)), gym.spaces.Discrete(4))
BOX = space_spec_of(gym.spaces.Box(-1.0, 1.0, (5,)), gym.spaces.Box(np.array([-2.0, 0.0]), np.array([1.0, 3.0])))
config = PolicyConfig(hidden_sizes=(8,), normalize_obs=True)
for algo, spec in {[(a, "DISCRETE" if s.discrete else "BOX") for a, s in CASES]!r}:
    spec = DISCRETE if spec == "DISCRETE" else BOX
    blob = Path({str(tmp_path)!r}, f"{{algo}}-{{spec.discrete}}.safetensors").read_bytes()
    actor = numpy_actor(algo, spec, config, codec.decode_policy(blob, arrays="numpy")[0])
    actor.act(np.zeros((2, 5), np.float32), np.random.default_rng(0), False)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _torch_mapped(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.farm
def test_a_worker_acting_mlp_runs_never_loads_torch(tmp_path):
    """A real Celery worker serves a SYNC PPO run and its final greedy evaluation: neither its main
    process nor its pool processes ever map libtorch (torch was most of a worker's start:
    benchmarks/startup.py)."""
    with LocalCluster(workers=2, name="rlfarm-test-notorch", log_dir=tmp_path, extra_env=WORKER_ENV) as farm:
        result = train_on(farm, tmp_path, "notorch", "--preset", "cartpole-ppo", "--total-steps", "4096")
        assert result.returncode == 0, result.stderr[-3000:]
        assert read_summary(tmp_path / "notorch")["eval_mean_return"] > 0  # its final greedy evaluation ran
        (worker,) = farm.worker_procs
        pool = _children(worker.pid)
        assert len(pool) == 2
        assert [pid for pid in [worker.pid, *pool] if _torch_mapped(pid)] == []


@pytest.mark.process
@pytest.mark.parametrize(
    "preset", ["cartpole-ppo", "cartpole-dqn", "pendulum-sac", "pendulum-td3", "cartpole-no-vel-lstm"]
)
def test_eval_and_load_of_an_mlp_policy_run_where_torch_cannot_be_imported(tmp_path, preset):
    """`rlfarm eval --policy FILE` and `rlfarm.load(FILE).predict(obs)` of an MLP policy with a `torch`
    that raises at import first on the path: neither needs torch."""
    from tests.test_load import save_fresh

    path = tmp_path / "best_policy.safetensors"
    save_fresh(path, preset)
    poisoned = tmp_path / "poisoned"
    (poisoned / "torch").mkdir(parents=True)
    (poisoned / "torch" / "__init__.py").write_text("raise ImportError('torch was imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poisoned), str(ROOT)])}
    out = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "eval", "--policy", str(path), "--episodes", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mean return" in out.stdout
    script = f"""
import rlfarm
policy = rlfarm.load({str(path)!r})
env = policy.make_env()
obs, _ = env.reset(seed=0)
action, _ = policy.predict(obs, deterministic=True)
assert env.action_space.contains(action), action
print("acted", action)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("acted")

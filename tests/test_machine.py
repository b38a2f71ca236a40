"""One fetch per machine (rlfarm.farm.policies.machine): the pool processes of a machine share each policy
version through a file, fetched from Redis by the first of them that needs it; every process still
checks what it reads, a forged or damaged blob is never shared, and a damaged copy is fetched again."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest
import redis

from rlfarm.errors import PolicyCorrupt
from rlfarm.farm.policies import machine as M
from rlfarm.farm.policies.machine import POLICY_SHARE_VAR

from .conftest import make_run


# ---- the directory (pure file mechanics) ---------------------------------------------------------
def test_versions_are_files_per_run_and_incarnation_and_old_ones_are_trimmed(tmp_path):
    shared = M.SharedPolicies(tmp_path / "rlfarm-policies-x" / "farm", keep=2)
    assert shared.usable()
    assert oct((tmp_path / "rlfarm-policies-x").stat().st_mode & 0o777) == "0o700"
    a0, b0 = shared.path("run", "inc-a", 0), shared.path("run", "inc-b", 0)
    assert a0 != b0 and a0 != shared.path("other", "inc-a", 0)  # a reused run id is another incarnation
    for v in range(4):
        path = shared.path("run", "inc-a", v)
        with shared.locked(path) as held:
            assert held and shared.read(path) is None
            shared.write(path, f"blob {v}".encode(), v)
    kept = sorted(p.name for p in a0.parent.glob("*.safetensors"))
    assert kept == ["2.safetensors", "3.safetensors"]  # the newest `keep`
    assert shared.read(shared.path("run", "inc-a", 3)) == b"blob 3"
    with shared.locked(b0):  # a new incarnation of the run writes: the old one's copies go
        shared.write(b0, b"new", 0)
    assert not a0.parent.exists() and shared.read(b0) == b"new"


def test_runs_untouched_for_an_hour_go_whatever_their_farm_and_empty_farms_with_them(tmp_path):
    """A farm whose Redis is gone (an embedded default's) leaves copies behind: the next write on the
    machine removes runs untouched for STALE_SECONDS, of any farm, and farms left empty."""
    top = tmp_path / "rlfarm-policies-x"
    gone, live = M.SharedPolicies(top / "gone-farm"), M.SharedPolicies(top / "live-farm")
    old = gone.path("old-run", "inc", 3)
    with gone.locked(old):
        gone.write(old, b"old", 3)
    recent = live.path("recent-run", "inc", 0)
    with live.locked(recent):
        live.write(recent, b"recent", 0)
    an_hour_ago = time.time() - M.STALE_SECONDS - 60
    for path in (old.parent, old.parent.parent):
        os.utime(path, (an_hour_ago, an_hour_ago))
    new = live.path("new-run", "inc", 0)
    with live.locked(new):
        live.write(new, b"new", 0)
    assert not (top / "gone-farm").exists()
    assert live.read(recent) == b"recent" and live.read(new) == b"new"


def test_a_directory_open_to_others_or_not_ours_is_not_used(tmp_path):
    top = tmp_path / "rlfarm-policies-x"
    top.mkdir(mode=0o755)
    top.chmod(0o755)
    assert not M.SharedPolicies(top / "farm").usable()


def test_the_root_follows_the_setting_and_the_farm(monkeypatch, tmp_path):
    monkeypatch.setenv(POLICY_SHARE_VAR, "off")
    assert M.default_root("redis://127.0.0.1:6379/0") is None
    monkeypatch.setenv(POLICY_SHARE_VAR, str(tmp_path))
    root = M.default_root("redis://127.0.0.1:6379/0")
    assert root.parent == tmp_path / f"rlfarm-policies-{os.getuid()}"
    assert root != M.default_root("redis://127.0.0.1:6380/0")  # another farm, other versions
    monkeypatch.delenv(POLICY_SHARE_VAR)
    assert M.default_root("redis://h/0").parent.name == f"rlfarm-policies-{os.getuid()}"


# ---- pool processes of one machine, against a real Redis -------------------------------------------
def _act_in_a_process(url: str, run: str, versions: list[int], share: str, queue) -> None:
    os.environ[POLICY_SHARE_VAR] = share
    from rlfarm.worker.handler import TaskHandler

    worker = TaskHandler(url)
    worker._enter(run, "incarnation-1")
    obs = np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)
    out = []
    for v in versions:
        actor, _, fetched = worker._actor_of(run, v)
        out.append((v, fetched, actor.value(obs).tolist()))
    queue.put((out, worker.counts["policy_fetch_bytes"]))


def _processes(url: str, run: str, versions: list[int], share: str, n: int) -> list:
    # Spawned, not forked: this test process has run torch, whose thread pool does not survive a fork
    # (Celery forks its pool from a main process that has not). Each process is a pool process's twin.
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_act_in_a_process, args=(url, run, versions, share, queue)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.farm
def test_four_processes_of_one_machine_fetch_each_version_once_and_act_alike(redis_only, tmp_path):
    """Four forked processes act with versions 0-2 of a run: with sharing, Redis sends each version
    once (one process fetched it, the others read its copy) and all act alike; without, each process
    fetches each version."""
    url = redis_only.redis_url
    _, store = make_run(url, "machine-share", versions=3)
    size = len(store.get_blob(2))
    shared = _processes(url, "machine-share", [0, 1, 2], str(tmp_path), 4)
    fetches = {v: sum(fetched for out, _ in shared for (w, fetched, _) in out if w == v) for v in range(3)}
    assert fetches == {0: 1, 1: 1, 2: 1}
    assert sum(nbytes for _, nbytes in shared) == pytest.approx(3 * size, rel=0.01)
    values = {v: {str(value) for out, _ in shared for (w, _, value) in out if w == v} for v in range(3)}
    assert all(len(v) == 1 for v in values.values())  # every process acts with the same weights

    alone = _processes(url, "machine-share", [0, 1, 2], "off", 4)
    assert sum(fetched for out, _ in alone for (_, fetched, _) in out) == 12


@pytest.mark.farm
@pytest.mark.fault  # a forged blob in Redis, a damaged copy on disk
def test_a_forged_blob_is_never_shared_and_a_damaged_copy_is_fetched_again(redis_only, tmp_path, monkeypatch):
    from rlfarm.worker.handler import TaskHandler

    monkeypatch.setenv(POLICY_SHARE_VAR, str(tmp_path))
    url = redis_only.redis_url
    _, store = make_run(url, "machine-forged", versions=1)
    client = redis.Redis.from_url(url)
    key = "rlfarm:machine-forged:policy:0"
    genuine = client.get(key)
    client.set(key, genuine[:-8] + bytes(8))  # its tensors no longer match its sha256

    def worker() -> TaskHandler:
        w = TaskHandler(url)
        w._enter("machine-forged", "incarnation-1")
        return w

    with pytest.raises(PolicyCorrupt):
        worker()._actor_of("machine-forged", 0)
    copy = worker().versions.shared.path("machine-forged", "incarnation-1", 0)
    assert not copy.exists()  # refused before anything was shared

    client.set(key, genuine)
    _, _, fetched = worker()._actor_of("machine-forged", 0)
    assert fetched and copy.read_bytes() == genuine
    _, _, fetched = worker()._actor_of("machine-forged", 0)
    assert not fetched  # read from the machine's copy

    copy.write_bytes(genuine[:-8] + bytes(8))  # the copy damaged on disk
    damaged = worker()
    _, _, fetched = damaged._actor_of("machine-forged", 0)
    assert fetched and damaged.counts["policy_fetches"] == 1 and not copy.exists()


# ---- float16 versions (farm.policy_dtype) ----------------------------------------------------------
def _probs_and_values(network, obs):
    import torch

    with torch.no_grad():
        x = torch.as_tensor(obs)
        return network.distribution(x).probs.numpy(), network.get_value(x).numpy().ravel()


@pytest.mark.parametrize("image", [True, False], ids=["nature-cnn", "mlp"])
def test_a_float16_version_acts_as_its_float32_learner_within_rounding(image):
    """A version published in float16 (farm.policy_dtype), loaded into a float32 network as a worker
    loads it, acts like the learner's float32 network: action probabilities within 0.002, values
    within 0.2 % of their scale, the same greedy action wherever the best two are not a rounding
    apart; and a version is half the bytes."""
    import torch

    from rlfarm import config as C
    from rlfarm.algos.ppo.policies import ActorCritic
    from rlfarm.core import codec
    from rlfarm.envs import SpaceSpec

    cfg = C.build("pong" if image else "cartpole-ppo", [])
    space = (
        SpaceSpec(84 * 84 * 4, True, 6, obs_shape=(4, 84, 84), obs_dtype="uint8") if image else SpaceSpec(4, True, 2)
    )
    torch.manual_seed(0)
    learner = ActorCritic(space, cfg.policy)
    with torch.no_grad():  # PPO initialises its last policy layer near uniform; a trained one is far from it
        last = max(int(name.split(".")[1]) for name, _ in learner.named_parameters() if name.startswith("actor."))
        for name, p in learner.named_parameters():
            if name.startswith(f"actor.{last}."):
                p.mul_(100.0)
    rng = np.random.default_rng(0)
    obs = (
        rng.integers(0, 256, (64, 4, 84, 84), dtype=np.uint8) if image else rng.normal(size=(256, 4)).astype(np.float32)
    )
    half = codec.wire_state(learner.state_dict(), "float16")
    assert all(t.dtype == torch.float16 for t in half.values() if t.is_floating_point())
    blob32 = codec.encode_policy(codec.wire_state(learner.state_dict()), {"version": "0"})
    blob16 = codec.encode_policy(half, {"version": "0"})
    assert len(blob16) < 0.5 * len(blob32) + 1024  # the tensors half, the header (names, hashes) as it was
    worker = ActorCritic(space, cfg.policy)
    worker.load_state_dict(codec.decode_policy(blob16)[0])
    assert all(p.dtype == torch.float32 for p in worker.parameters())
    p32, v32 = _probs_and_values(learner, obs)
    p16, v16 = _probs_and_values(worker, obs)
    diff = np.abs(p16 - p32).max()
    print(
        f"{'nature-cnn' if image else 'mlp'}: largest difference in action probability {diff:.2e}, "
        f"in value {np.abs(v16 - v32).max():.2e} (scale {np.abs(v32).max():.2e})"
    )
    assert 0 < diff < 0.002
    assert np.abs(v16 - v32).max() <= 0.002 * max(np.abs(v32).max(), 1e-3)
    top2 = np.sort(p32, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * diff
    assert clear.any() and (p16.argmax(1) == p32.argmax(1))[clear].all()


@pytest.mark.farm
def test_a_run_publishing_float16_versions_trains_and_keeps_float32_itself(farm, tmp_path):
    """`--set farm.policy_dtype=float16` through the real farm: every version in Redis holds float16
    tensors (half the bytes), the workers act with them, the run finishes, and the learner's own
    final_policy.safetensors is float32."""
    import torch
    from safetensors.torch import load_file

    from rlfarm.core import codec
    from rlfarm.farm import keys

    from .conftest import run_cli

    result = run_cli(
        "train",
        "--redis",
        farm.redis_url,
        "--run-id",
        "half",
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "8192",
        "--set",
        "farm.policy_dtype=float16",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = redis.Redis.from_url(farm.redis_url)
    latest = int(client.get(keys.latest("half")))
    assert latest >= 1
    state, _ = codec.decode_policy(client.get(keys.policy("half", latest)))
    assert {t.dtype for t in state.values()} == {torch.float16}
    final = load_file(tmp_path / "half" / "final_policy.safetensors")
    assert {t.dtype for t in final.values()} == {torch.float32}
    for name, tensor in final.items():  # the published version is the learner's, rounded
        torch.testing.assert_close(state[name].float(), tensor, rtol=1e-3, atol=1e-4)

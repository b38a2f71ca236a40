"""What a process that can write to Redis (or hand over a file) can and cannot make rlfarm do.

- Env allowlist: workers (and `rlfarm eval` of a file) build only registered gymnasium ids and
  "module:callable" envs from modules in RLFARM_ALLOWED_ENV_MODULES / `--allow-env-module`; anything
  else is refused before it is imported.
- RLFARM_SECRET: run metadata, policy blobs and task specs carry an HMAC-SHA256; with the secret
  set, unsigned or forged ones are refused (a blob with zeroed weights and a recomputed sha256 too).
- A policy is the version of the key it was read from, whatever its own metadata claims.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from rlfarm.core import codec, signing
from rlfarm.envs import allowed_modules_env, check_env_allowed, env_module, make_env, make_vector_env
from rlfarm.errors import EnvError, PolicyCorrupt, RolloutError, SignatureError
from rlfarm.farm.app import make_app
from rlfarm.farm.connection import connect
from rlfarm.farm.policies.store import PolicyStore
from rlfarm.local.cluster import LocalCluster
from rlfarm.trainer.channel import FarmLink

from .conftest import ROOT, WORKER_ENV, make_run, run_cli, run_command, task_channel, task_specs

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("signed-farm")

SECRET = "test-secret-0123456789abcdef"
MARKER = Path(tempfile.gettempdir()) / f"rlfarm-import-marker-{os.getuid()}"  # see tests/import_marker.py


def _zeroed(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


# ---- signing, pure ---------------------------------------------------------------------------------


def test_sign_and_verify_refuse_tampered_missing_and_other_secret():
    data = signing.canonical({"b": 1, "a": [1, 2.5, "x"]})
    assert data == b'{"a":[1,2.5,"x"],"b":1}'
    sig = signing.sign(data, SECRET)
    assert len(sig) == 64 and sig == signing.sign(data, SECRET.encode())
    signing.verify(data, sig, SECRET)
    with pytest.raises(SignatureError, match="bad signature"):
        signing.verify(data + b" ", sig, SECRET)
    with pytest.raises(SignatureError, match="bad signature"):
        signing.verify(data, sig, "another secret")
    with pytest.raises(SignatureError, match="not signed, but this farm signs its data"):
        signing.verify(data, None, SECRET)
    with pytest.raises(SignatureError, match="bad signature"):
        signing.verify(data, "zz" + sig[2:], SECRET)


def test_secret_comes_from_the_environment_only(monkeypatch):
    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    assert signing.secret_from_env() is None
    monkeypatch.setenv("RLFARM_SECRET", "")
    assert signing.secret_from_env() is None  # empty: signing off
    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    assert signing.secret_from_env() == SECRET.encode()


def test_spec_signing():
    spec = {
        "run": "r",
        "iteration": 3,
        "index": 1,
        "version": "latest",
        "steps": 64,
        "seed": 7,
        "kind": "rollout",
        "epsilon": 0.05,
        "episodes": 0,
    }
    signed = signing.sign_spec(spec, SECRET)
    assert set(signed) == set(spec) | {"sig"} and spec == {k: v for k, v in signed.items() if k != "sig"}
    assert signing.verify_spec(signed, SECRET) == spec
    # Field order does not matter, and the msgpack round trip of a Celery message keeps it valid.
    assert signing.verify_spec(dict(reversed(list(signed.items()))), SECRET) == spec
    assert signing.verify_spec(codec.unpack(codec.pack(signed)), SECRET) == spec
    for field, value in [("version", 0), ("run", "other"), ("epsilon", 0.5), ("steps", 65)]:
        with pytest.raises(SignatureError, match="task spec has a bad signature"):
            signing.verify_spec({**signed, field: value}, SECRET)
    with pytest.raises(SignatureError, match="bad signature"):
        signing.verify_spec({**signed, "extra": 1}, SECRET)  # every field is signed, new ones too
    with pytest.raises(SignatureError, match="task spec is not signed"):
        signing.verify_spec(spec, SECRET)
    # Without a secret: nothing is checked; signed and unsigned specs both come back without "sig".
    assert signing.sign_spec(spec, None) == spec
    assert signing.verify_spec(signed, None) == spec and signing.verify_spec(spec, None) == spec
    assert signing.sign_spec(signed, SECRET) == signed  # re-signing replaces, never signs the sig


def test_run_meta_sealing():
    meta = {"config": {"env": {"id": "CartPole-v1"}}, "space": {"obs_dim": 4}}
    sealed = signing.seal_run_meta("r", meta, SECRET)
    assert set(json.loads(sealed)) == {"signed", "hmac"}
    assert signing.open_run_meta("r", sealed, SECRET) == meta
    assert signing.open_run_meta("r", sealed, None) == meta  # a reader without a secret reads both forms
    assert signing.open_run_meta("r", json.dumps(meta), None) == meta
    with pytest.raises(SignatureError, match="run 'r': metadata in Redis is not signed"):
        signing.open_run_meta("r", json.dumps(meta), SECRET)
    with pytest.raises(SignatureError, match="run 'other': metadata in Redis has a bad signature"):
        signing.open_run_meta("other", sealed, SECRET)  # replayed under another run id
    forged = json.loads(sealed)
    forged["signed"] = forged["signed"].replace("CartPole-v1", "tempfile:mkdtemp")
    with pytest.raises(SignatureError, match="bad signature"):
        signing.open_run_meta("r", json.dumps(forged), SECRET)


def test_policy_blob_hmac_in_codec():
    state = {"w": torch.randn(3, 4), "b": torch.zeros(4)}
    meta = {"version": "2", "algo": "ppo", "run": "r", "created": "1.0"}
    blob = codec.encode_policy(state, meta, SECRET)
    out, got = codec.decode_policy(blob, SECRET)
    assert torch.equal(out["w"], state["w"]) and len(got["hmac"]) == 64
    assert codec.decode_policy(blob)[1]["hmac"] == got["hmac"]  # readable without a secret
    with pytest.raises(codec.CodecError, match="bad signature"):
        codec.decode_policy(blob, "another secret")
    with pytest.raises(codec.CodecError, match="not signed"):
        codec.decode_policy(codec.encode_policy(state, meta), SECRET)
    # Zeroed weights with a recomputed sha256, keeping the genuine hmac: the hmac covers the sha256.
    forged = codec.encode_policy(_zeroed(state), {**got, "sha256": "ignored"})
    assert codec.decode_policy(forged)[0]["w"].abs().sum() == 0  # today's check alone passes it
    with pytest.raises(codec.CodecError, match="bad signature"):
        codec.decode_policy(forged, SECRET)
    # The genuine weights and hmac relabelled as another version or run.
    for field, value in [("version", "3"), ("run", "other"), ("algo", "dqn")]:
        relabelled = codec.encode_policy(state, {**got, field: value})
        with pytest.raises(codec.CodecError, match="bad signature"):
            codec.decode_policy(relabelled, SECRET)
    # Fields outside the signed set (created, env_steps) may change without breaking the hmac.
    codec.decode_policy(codec.encode_policy(state, {**got, "created": "2.0"}), SECRET)


# ---- env allowlist, in process ----------------------------------------------------------------------


def test_untrusted_env_ids_need_a_registered_id_or_an_allowed_module(monkeypatch):
    MARKER.unlink(missing_ok=True)
    monkeypatch.delenv("RLFARM_ALLOWED_ENV_MODULES", raising=False)
    with pytest.raises(EnvError) as err:
        make_env("tempfile:mkdtemp", trusted=False)
    assert str(err.value) == (
        "env 'tempfile:mkdtemp' is not allowed on this worker: not a registered gymnasium id, and module "
        "'tempfile' is not in RLFARM_ALLOWED_ENV_MODULES (start the worker with --allow-env-module tempfile)"
    )
    with pytest.raises(EnvError, match="module 'tests.import_marker' is not in RLFARM_ALLOWED_ENV_MODULES"):
        make_vector_env("tests.import_marker:make", 2, trusted=False)
    assert "tests.import_marker" not in sys.modules and not MARKER.exists()  # refused before import
    with pytest.raises(EnvError, match="not allowed on this worker"):
        make_env("tests.tiny_envs:terminating", trusted=False)
    make_env("CartPole-v1", trusted=False).close()  # registered with gymnasium: always fine
    make_env("tests.tiny_envs:terminating").close()  # trusted (the trainer's own command line)

    monkeypatch.setenv("RLFARM_ALLOWED_ENV_MODULES", "os, tests.tiny_envs")
    make_vector_env("tests.tiny_envs:terminating", 2, trusted=False).close()
    with pytest.raises(EnvError, match="module 'tests.tiny_envs_other'"):  # a prefix is not a parent
        make_env("tests.tiny_envs_other:x", trusted=False)
    # Only the allowed modules' own code, not what they import or keep private.
    with pytest.raises(EnvError, match="'TimeLimit' comes from module 'gymnasium.wrappers"):
        make_env("tests.tiny_envs:TimeLimit", trusted=False)
    with pytest.raises(EnvError, match="'__loader__' is private"):
        make_env("tests.tiny_envs:__loader__", trusted=False)
    monkeypatch.setenv("RLFARM_ALLOWED_ENV_MODULES", "tests")  # a package allows its submodules
    make_env("tests.tiny_envs:terminating", trusted=False).close()
    check_env_allowed("CartPole-v1")
    assert not MARKER.exists()


def test_env_module_and_the_environment_of_embedded_workers(monkeypatch):
    assert env_module("mypkg.envs:make") == "mypkg.envs" and env_module("CartPole-v1") is None
    assert env_module("ALE/Pong-v5") is None
    monkeypatch.delenv("RLFARM_ALLOWED_ENV_MODULES", raising=False)
    assert allowed_modules_env("CartPole-v1") == {}
    assert allowed_modules_env("mypkg.envs:make") == {"RLFARM_ALLOWED_ENV_MODULES": "mypkg.envs"}
    monkeypatch.setenv("RLFARM_ALLOWED_ENV_MODULES", "a,mypkg.envs")
    assert allowed_modules_env("mypkg.envs:make") == {"RLFARM_ALLOWED_ENV_MODULES": "a,mypkg.envs"}
    assert allowed_modules_env("b:make") == {"RLFARM_ALLOWED_ENV_MODULES": "a,mypkg.envs,b"}


# ---- the policy store, real Redis --------------------------------------------------------------------


@pytest.mark.farm
def test_forged_policy_with_recomputed_sha256_is_refused_with_a_secret(redis_only, monkeypatch):
    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    client = connect(redis_only.redis_url)
    store = PolicyStore(client, "forged")
    state = {"layer.weight": torch.randn(4, 3), "layer.bias": torch.randn(4)}
    store.publish(0, state, "ppo")
    store.publish(1, state, "ppo")
    assert len(store.get(1)[1]["hmac"]) == 64
    _, genuine = store.get(1)
    # Zeroed weights, sha256 recomputed by codec.encode_policy, written over v1 by someone without
    # the secret: once with no hmac, once keeping the genuine one.
    for meta in ({k: v for k, v in genuine.items() if k != "hmac"}, genuine):
        client.set("rlfarm:forged:policy:1", codec.encode_policy(_zeroed(state), meta))
        with pytest.raises(
            PolicyCorrupt, match="policy version 1 is corrupt: policy blob (is not signed|has a bad signature)"
        ):
            store.get(1)
    # Today's limit without a secret: the sha256 only detects accidents, so the forgery passes.
    forged, _ = PolicyStore(client, "forged", secret=None).get(1)
    assert all(t.abs().sum() == 0 for t in forged.values())
    with pytest.raises(PolicyCorrupt, match="bad signature"):  # another secret: refused too
        PolicyStore(client, "forged", secret="another").get(0)
    assert torch.equal(store.get(0)[0]["layer.weight"], state["layer.weight"])


@pytest.mark.farm
def test_a_blob_is_the_version_and_run_of_its_key(redis_only, monkeypatch):
    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    client = connect(redis_only.redis_url)
    store = PolicyStore(client, "replayed", keep=5)
    for v in range(3):
        store.publish(v, {"w": torch.full((2,), float(v))}, "ppo")
    client.set("rlfarm:replayed:policy:0", client.get("rlfarm:replayed:policy:2"))  # v2 replayed as v0
    with pytest.raises(PolicyCorrupt, match="policy stored as v0 but claims v2"):
        store.get(0)
    other = PolicyStore(client, "replayed-other")
    other.publish(0, {"w": torch.zeros(2)}, "ppo")
    client.set("rlfarm:replayed:policy:1", client.get("rlfarm:replayed-other:policy:0"))
    with pytest.raises(PolicyCorrupt, match="version 1 belongs to run 'replayed-other'|stored as v1 but claims v0"):
        store.get(1)
    client.set(
        "rlfarm:replayed:policy:1",
        codec.encode_policy({"w": torch.zeros(2)}, {"version": "1", "run": "replayed-other"}),
    )
    with pytest.raises(PolicyCorrupt, match="policy version 1 belongs to run 'replayed-other'"):
        store.get(1)
    assert store.get("latest")[1]["version"] == "2"


@pytest.mark.farm
def test_run_meta_is_signed_in_redis(redis_only, monkeypatch):
    client = connect(redis_only.redis_url)
    meta = {"config": {"env": {"id": "CartPole-v1"}}, "space": {"obs_dim": 4}}
    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    PolicyStore(client, "meta-signed").set_run_meta(meta)
    assert set(json.loads(client.get("rlfarm:meta-signed:meta"))) == {"signed", "hmac"}
    assert PolicyStore(client, "meta-signed").run_meta() == meta
    assert PolicyStore(client, "meta-signed", secret=None).run_meta() == meta
    PolicyStore(client, "meta-plain", secret=None).set_run_meta(meta)  # written without the secret
    assert json.loads(client.get("rlfarm:meta-plain:meta")) == meta
    with pytest.raises(SignatureError, match="run 'meta-plain': metadata in Redis is not signed"):
        PolicyStore(client, "meta-plain").run_meta()
    client.set("rlfarm:meta-copied:meta", client.get("rlfarm:meta-signed:meta"))
    with pytest.raises(SignatureError, match="run 'meta-copied': metadata in Redis has a bad signature"):
        PolicyStore(client, "meta-copied").run_meta()


@pytest.mark.farm
def test_worker_caches_a_policy_under_the_version_it_fetched(redis_only, monkeypatch):
    from rlfarm.worker.handler import TaskHandler

    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    _, store = make_run(redis_only.redis_url, "cache-key", versions=3)
    client = connect(redis_only.redis_url)
    worker = TaskHandler(redis_only.redis_url)
    _, version, fetched = worker._actor_of("cache-key", 1)
    assert (version, fetched) == (1, True) and worker.versions.cache.get(("cache-key", 1)) is not None
    client.set("rlfarm:cache-key:policy:0", client.get("rlfarm:cache-key:policy:2"))
    with pytest.raises(PolicyCorrupt, match="stored as v0 but claims v2"):
        worker._actor_of("cache-key", 0)
    assert worker.versions.cache.get(("cache-key", 0)) is None and worker.versions.cache.get(("cache-key", 2)) is None
    assert worker._actor_of("cache-key", "latest")[1:] == (2, True)
    assert worker._actor_of("cache-key", 2)[1:] == (2, False)


# ---- workers on the shared farm (no secret) -----------------------------------------------------------


@pytest.mark.farm
def test_worker_refuses_envs_that_are_not_allowed(farm):
    MARKER.unlink(missing_ok=True)
    for run_id, env_id, module in [
        ("evil-tempfile", "tempfile:mkdtemp", "tempfile"),
        ("evil-import", "tests.import_marker:make", "tests.import_marker"),
    ]:
        _, store = make_run(farm.redis_url, run_id)
        meta = store.run_meta()
        meta["config"]["env"]["id"] = env_id  # what anyone who can write to Redis could do
        store.set_run_meta(meta)
        with pytest.raises(
            RolloutError,
            match=f"EnvError: env '{env_id}' is not allowed on this worker: not a "
            f"registered gymnasium id, and module '{module}' is not in "
            f"RLFARM_ALLOWED_ENV_MODULES",
        ):
            task_channel(farm.redis_url, run_id).gather_group(task_specs(0, 1, 8))
    assert not MARKER.exists(), MARKER.read_text()  # the worker never imported the module
    make_run(farm.redis_url, "gym-id")  # CartPole-v1, registered with gymnasium: builds as before
    assert task_channel(farm.redis_url, "gym-id").gather_group(task_specs(0, 1, 8))[0].rollout["rewards"].size > 0


# ---- a farm with RLFARM_SECRET, its worker started by `rlfarm worker --allow-env-module` ----------------


class _CliWorkerCluster(LocalCluster):
    """Redis plus workers started as a user would, `rlfarm worker --allow-env-module tests.tiny_envs`."""

    def worker_command(self, concurrency: int, node: str) -> list[str]:
        return [
            sys.executable,
            str(ROOT / "cli.py"),
            "worker",
            "--concurrency",
            str(concurrency),
            "--hostname",
            node,
            "--loglevel",
            "WARNING",
            "--allow-env-module",
            "tests.tiny_envs",
        ]


@pytest.fixture(scope="module")
def signed_farm(tmp_path_factory):
    env = {
        "PYTHONPATH": WORKER_ENV["PYTHONPATH"],
        "RLFARM_SECRET": SECRET,
        "RLFARM_ALLOWED_ENV_MODULES": "",
    }  # tests.tiny_envs comes from --allow-env-module alone
    with _CliWorkerCluster(
        workers=1, name="rlfarm-test-signed", log_dir=tmp_path_factory.mktemp("signed"), extra_env=env
    ) as cluster:
        yield cluster


def _cli(*args, secret=SECRET):
    return run_cli(*args, env={"RLFARM_SECRET": secret})


@pytest.mark.farm
def test_signed_farm_trains_and_refuses_a_forged_policy(signed_farm, tmp_path, monkeypatch):
    url = signed_farm.redis_url
    result = _cli(
        "train",
        "--redis",
        url,
        "--run-id",
        "signed",
        "--total-steps",
        "2048",
        "--logdir",
        str(tmp_path),
        "--set",
        "farm.num_tasks=2",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=512",
        "--set",
        "ppo.num_minibatches=4",
        "--set",
        "eval.interval=1024",
        "--set",
        "eval.episodes=2",
    )
    assert result.returncode == 0, result.stderr
    client = connect(url)
    assert set(json.loads(client.get("rlfarm:signed:meta"))) == {"signed", "hmac"}
    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    store = PolicyStore(client, "signed")
    latest = store.latest()
    state, meta = store.get(latest)  # verifies
    assert len(meta["hmac"]) == 64

    # An exported file is re-signed (its hmac also covers env and policy) and verifies in eval.
    out = tmp_path / "exported.safetensors"
    assert _cli("checkpoints", "export", "--redis", url, "--run", "signed", "-o", str(out)).returncode == 0
    ev = _cli("eval", "--policy", str(out), "--episodes", "2")
    assert ev.returncode == 0 and f"CartPole-v1, policy v{latest}: mean return" in ev.stdout, ev.stderr
    for args, secret in [
        (["--policy", str(out)], "another secret"),
        (["--run", "signed", "--redis", url], "another secret"),
    ]:
        bad = _cli("eval", *args, "--episodes", "1", secret=secret)
        lines = [line for line in bad.stderr.splitlines() if line.strip()]
        assert bad.returncode == 1 and len(lines) == 1 and "bad signature" in lines[0], bad.stderr
    forged_file = tmp_path / "forged.safetensors"
    forged_file.write_bytes(codec.encode_policy(_zeroed(state), codec.decode_policy(out.read_bytes())[1]))
    bad = _cli("eval", "--policy", str(forged_file), "--episodes", "1")
    assert bad.returncode == 1 and bad.stderr.startswith("rlfarm: error: policy blob has a bad signature")

    # A forged next version: zeroed weights, sha256 recomputed, no valid hmac. Workers refuse it.
    forged = codec.encode_policy(
        _zeroed(state), {"version": str(latest + 1), "algo": "ppo", "run": "signed", "created": "0"}
    )
    client.set(f"rlfarm:signed:policy:{latest + 1}", forged)
    client.zadd("rlfarm:signed:versions", {str(latest + 1): latest + 1})
    client.set("rlfarm:signed:policy:latest", latest + 1)
    with pytest.raises(RolloutError, match=f"policy version {latest + 1} is corrupt: policy blob is not signed"):
        task_channel(url, "signed").gather_group(task_specs(50, 1, 8, version=latest + 1))
    # The genuine version still serves.
    good = task_channel(url, "signed").gather_group(task_specs(51, 1, 8, version=latest))
    assert good[0].version == latest


@pytest.mark.farm
def test_allow_env_module_option_and_unsigned_meta_on_a_signed_farm(signed_farm, monkeypatch):
    url = signed_farm.redis_url
    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    make_run(url, "signed-tiny", ["env.id=tests.tiny_envs:terminating", "env.num_envs=1"])  # signed meta
    results = task_channel(url, "signed-tiny").gather_group(task_specs(0, 1, 6))
    assert results[0].rollout["rewards"].ravel().tolist() == [1.0] * 6
    # Metadata written by someone without the secret (here: naming an allowed env) is refused.
    store = PolicyStore(connect(url), "signed-unsigned-meta")
    make_run(url, "signed-unsigned-meta")
    meta = store.run_meta()
    PolicyStore(connect(url), "signed-unsigned-meta", secret=None).set_run_meta(meta)
    with pytest.raises(
        RolloutError,
        match="SignatureError: run 'signed-unsigned-meta': metadata in Redis is "
        "not signed, but this farm signs its data",
    ):
        task_channel(url, "signed-unsigned-meta").gather_group(task_specs(0, 1, 8))


@pytest.mark.process
def test_allow_env_module_rejects_what_is_not_a_module_name():
    bad = run_command("worker", "--allow-env-module", "../evil", "--redis", "redis://127.0.0.1:1/0", timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "rlfarm: error: --allow-env-module '../evil' is not a module name (like mypkg or mypkg.envs)"
    )


@pytest.mark.process
def test_eval_treats_the_env_named_by_a_policy_file_as_untrusted(tmp_path):
    MARKER.unlink(missing_ok=True)
    env = {**os.environ, **WORKER_ENV}
    env.pop("RLFARM_SECRET", None)
    for env_id, module in [("tempfile:mkdtemp", "tempfile"), ("tests.import_marker:make", "tests.import_marker")]:
        path = tmp_path / f"{module}.safetensors"
        path.write_bytes(codec.encode_policy({"w": torch.zeros(2)}, {"version": "0", "algo": "ppo", "env": env_id}))
        result = run_command("eval", "--policy", str(path), env=env, timeout=300)
        assert result.returncode == 1
        assert result.stderr.strip() == (
            f"rlfarm: error: env '{env_id}' is not allowed here: not a registered gymnasium id, and module "
            f"'{module}' is not in RLFARM_ALLOWED_ENV_MODULES (pass --env {env_id} if you trust it, or set "
            f"RLFARM_ALLOWED_ENV_MODULES={module})"
        )
    assert not MARKER.exists()


def test_results_are_signed_and_a_forged_one_is_dropped(redis_only, monkeypatch):
    """With RLFARM_SECRET, a result pushed onto a run's list without it (poisoned training data) is
    dropped and counted; a signed one is taken; one signed for another run is dropped too."""
    from rlfarm.core import codec, signing
    from rlfarm.farm import keys
    from rlfarm.farm.connection import connect

    secret = b"s3cret"
    monkeypatch.setenv("RLFARM_SECRET", secret.decode())
    d = FarmLink(make_app(redis_only.redis_url), connect(redis_only.redis_url), "sealed", 60.0, 1).open()
    client = connect(redis_only.redis_url)
    payload = codec.pack({"kind": "rollout", "iteration": 0, "index": 0, "task_id": "t"})
    client.rpush(keys.results("sealed"), payload)  # unsigned
    client.rpush(keys.results("sealed"), signing.seal_result("other-run", payload, secret))
    client.rpush(keys.results("sealed"), signing.seal_result("sealed", payload, secret))
    assert d.receive(1.0) is None and d.receive(1.0) is None
    assert d.receive(1.0).task_id == "t"
    assert d.stats.forged == 2
    assert signing.open_result("sealed", payload, None) == payload  # no secret: taken as it is

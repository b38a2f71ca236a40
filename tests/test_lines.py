"""A version line per policy (rlfarm.farm.policies.lines): in a run of several policies each policy gets a new
version only when its weights change, workers act with each policy's own version and fetch an
unchanged one once, pins and retention hold per line, a forged version of one policy is refused and
written back, and an ASYNC run through a farm measures each policy's lag on its own line. Real
redis-server and Celery workers; mpe2's simple_adversary_v3 (1 adversary, 2 good agents)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import json
from collections import Counter

import numpy as np
import pytest
import torch

from rlfarm.config import RunConfig, to_dict
from rlfarm.core.protocol import TaskSpec
from rlfarm.envs import make_vector_env, space_spec
from rlfarm.errors import PolicyCorrupt
from rlfarm.farm.connection import connect
from rlfarm.farm.policies.lines import LinedStore
from rlfarm.farm.policies.store import PolicyStore

pytestmark = [
    pytest.mark.farm,
    pytest.mark.skipif(
        importlib.util.find_spec("mpe2") is None,
        reason='needs mpe2 (the multiagent extra: pip install -e ".[multiagent]")',
    ),
]
ADV = "mpe2/simple_adversary_v3"
MAP = ("adversary_*=adversary", "agent_*=agent")
POLICIES = ("adversary", "agent")


def _config() -> RunConfig:
    base = RunConfig()
    return dataclasses.replace(
        base,
        env=dataclasses.replace(base.env, id=ADV, num_envs=6, policy_map=MAP),
        policy=dataclasses.replace(base.policy, hidden_sizes=(16,)),
    )


def _group():
    from rlfarm.algos import network_for

    envs = make_vector_env(ADV, 6, options={"policy_map": MAP})
    spec = space_spec(envs)
    torch.manual_seed(0)
    return envs, spec, network_for("ppo", spec, _config().policy)


def _state(network, adversary: float, agent: float) -> dict[str, torch.Tensor]:
    """The group's weights with each policy's first bias set to a value of its own."""
    state = {k: v.clone() for k, v in network.state_dict().items()}
    for name, value in (("adversary", adversary), ("agent", agent)):
        bias = next(k for k in state if k.startswith(f"nets.{name}.") and k.endswith("bias"))
        state[bias].fill_(value)
    return state


def test_a_policy_gets_a_new_version_only_when_its_weights_change_and_pins_hold_per_line(redis_only):
    client = connect(redis_only.redis_url)
    _, _, network = _group()
    store = LinedStore(client, "lines-pace", POLICIES, keep=1)
    for v in range(6):  # the adversary learns every version; the agents change once, at v2
        store.publish(v, _state(network, adversary=float(v), agent=0.0 if v < 2 else 1.0), "ppo")
        if v == 1:
            store.pin(1, "eval")  # v1 is made of adversary 1 and agent 0
            store.pin(1, "league")
    assert store.lines_of(1) == {"adversary": 1, "agent": 0}
    assert store.lines_of(5) == {"adversary": 5, "agent": 1} == store.heads
    lines = {name: PolicyStore(client, "lines-pace", line=name) for name in POLICIES}
    assert lines["adversary"].versions() == [1, 5] and lines["agent"].versions() == [0, 1]  # keep=1, and v1's pinned
    # A line version holds its policy's weights alone, named as the line's and the run version's.
    own, meta = lines["agent"].get(0)
    assert set(own) == {k[len("nets.agent.") :] for k in network.state_dict() if k.startswith("nets.agent.")}
    assert meta["line"] == "agent" and meta["run_version"] == "0"
    # The run's version stays whole (what evaluations, exports and resumes read) and names its lines.
    whole, run_meta = store.get(5)
    assert set(whole) == set(network.state_dict()) and json.loads(run_meta["lines"]) == {"adversary": 5, "agent": 1}
    store.unpin(1, "eval")  # the league still holds v1, and with it its line versions
    assert lines["agent"].versions() == [0, 1]
    store.unpin(1, "league")
    assert lines["agent"].versions() == [1] and lines["adversary"].versions() == [5] and store.versions() == [5]


def test_workers_act_with_each_policys_line_and_fetch_an_unchanged_policy_once(redis_only):
    from rlfarm.worker.policies import PolicyVersions

    client = connect(redis_only.redis_url)
    envs, spec, network = _group()
    store = LinedStore(client, "lines-fetch", POLICIES, keep=5)
    meta = {"config": to_dict(_config()), "space": spec.to_dict()}
    for v in range(4):  # the agents' policy never changes (a frozen one)
        store.publish(v, _state(network, adversary=0.1 * v, agent=0.5), "ppo")
    counts: Counter[str] = Counter()
    worker = PolicyVersions(client, None, lambda run: meta, {}, counts)
    acted = [worker.actor("lines-fetch", v, store.lines_of(v)) for v in range(4)]
    assert [version for _, version, _ in acted] == [0, 1, 2, 3] and all(fetched for *_, fetched in acted)
    assert counts["policy_fetches"] == 4 + 1  # the adversary's four versions, the agents' one
    line_bytes = {name: len(client.get(f"rlfarm:lines-fetch:policy@{name}:0")) for name in POLICIES}
    assert counts["policy_fetch_bytes"] < 4 * len(store.get_blob(3))  # less than the run's blobs
    # An ASYNC task's "latest": the run's pointer, and the line versions its metadata names (read
    # from the blob's header: its tensors are not fetched).
    other: Counter[str] = Counter()
    fresh = PolicyVersions(client, None, lambda run: meta, {}, other)
    latest_actor, version, _ = fresh.actor("lines-fetch", "latest")
    assert version == 3 and other["policy_fetches"] == 2 and fresh.acted_lines("lines-fetch", 3) == store.lines_of(3)
    assert other["policy_fetch_bytes"] == len(client.get("rlfarm:lines-fetch:policy@adversary:3")) + line_bytes["agent"]
    # A line's pointer gone (someone deleted it) changes nothing: it is never read.
    client.delete("rlfarm:lines-fetch:policy@agent:latest")
    spare: Counter[str] = Counter()
    assert PolicyVersions(client, None, lambda run: meta, {}, spare).actor("lines-fetch", "latest")[1] == 3
    assert spare["policy_fetch_bytes"] == other["policy_fetch_bytes"]
    # Acting from the lines is acting from the whole version, bit for bit.
    whole, _, _ = PolicyVersions(client, None, lambda run: meta, {}, Counter()).actor("lines-fetch", 3)
    obs = envs.reset(seed=3)[0].astype(np.float32)
    for actor in (acted[3][0], latest_actor):
        a, logp, values = actor.act(obs, np.random.default_rng(1))
        b, logq, others = whole.act(obs, np.random.default_rng(1))
        assert (a == b).all() and np.array_equal(logp, logq) and np.array_equal(values, others)


@pytest.mark.parametrize("secret", [None, "lines-secret"], ids=["unsigned", "signed"])
def test_latest_acts_with_the_line_versions_its_run_version_names_never_a_lines_own_pointer(
    redis_only, monkeypatch, secret
):
    """Issue 50: a worker that read each line's `latest` pointer acted with whatever it said. Held at
    0 while both policies learned, the agents' stale weights were mixed into a fresh run version
    and credited as fresh. Now the run version's metadata names its line versions (signed with a
    secret), the pointer is never read, and the worker says which line versions acted."""
    from rlfarm.worker.policies import PolicyVersions

    if secret:
        monkeypatch.setenv("RLFARM_SECRET", secret)
    client = connect(redis_only.redis_url)
    envs, spec, network = _group()
    store = LinedStore(client, "lines-held", POLICIES, keep=5)
    meta = {"config": to_dict(_config()), "space": spec.to_dict()}
    for v in range(4):  # both policies learn every version
        store.publish(v, _state(network, adversary=float(v), agent=float(v)), "ppo")
    client.set("rlfarm:lines-held:policy@agent:latest", 0)  # held back at the first
    counts: Counter[str] = Counter()
    worker = PolicyVersions(client, None, lambda run: meta, {}, counts)
    actor, version, _ = worker.actor("lines-held", "latest")
    whole, _, _ = PolicyVersions(client, None, lambda run: meta, {}, Counter()).actor("lines-held", 3)
    obs = envs.reset(seed=3)[0].astype(np.float32)  # acts as run version 3's whole blob does
    assert np.array_equal(actor.act(obs, np.random.default_rng(1))[2], whole.act(obs, np.random.default_rng(1))[2])
    assert version == 3 and worker.acted_lines("lines-held", 3) == {"adversary": 3, "agent": 3} == store.lines_of(3)
    if secret:  # the lines a run version names are signed with it: rewritten, the version is refused
        from rlfarm.core import codec

        state, signed = codec.decode_policy(store.get_blob(3), secret)
        held = {**signed, "lines": json.dumps({"adversary": 3, "agent": 0})}  # its hmac kept as it was
        client.set("rlfarm:lines-held:policy:3", codec.encode_policy(state, held))
        with pytest.raises(PolicyCorrupt, match="policy version 3 is corrupt: policy blob has a bad signature"):
            PolicyVersions(client, None, lambda run: meta, {}, Counter()).actor("lines-held", "latest")


def test_a_forged_version_of_one_policy_is_refused_and_written_back(redis_only, monkeypatch):
    from rlfarm.worker.policies import PolicyVersions

    monkeypatch.setenv("RLFARM_SECRET", "lines-secret")
    client = connect(redis_only.redis_url)
    _, spec, network = _group()
    store = LinedStore(client, "lines-forged", POLICIES, keep=5)
    meta = {"config": to_dict(_config()), "space": spec.to_dict()}
    store.publish(0, _state(network, adversary=0.0, agent=0.0), "ppo")
    store.publish(1, _state(network, adversary=1.0, agent=0.0), "ppo")
    adversary_key, agent_key = "rlfarm:lines-forged:policy@adversary:1", "rlfarm:lines-forged:policy@agent:0"
    # The agents' weights, validly signed, put where the adversary's version 1 belongs.
    client.set(adversary_key, client.get(agent_key).replace(b'"version":"0"', b'"version":"1"'))
    worker = PolicyVersions(client, None, lambda run: meta, {}, Counter())
    with pytest.raises(PolicyCorrupt, match="policy 'adversary' version 1 is corrupt"):  # its hmac no longer holds
        worker.actor("lines-forged", 1, store.lines_of(1))
    client.set(adversary_key, client.get(agent_key))  # untouched, but of the other line (and version)
    with pytest.raises(PolicyCorrupt, match="policy 'adversary' stored as v1 but claims v0"):
        worker.actor("lines-forged", 1, store.lines_of(1))
    line = PolicyStore(client, "lines-forged", line="adversary")
    client.set("rlfarm:lines-forged:policy@adversary:0", client.get(agent_key))
    with pytest.raises(PolicyCorrupt, match="policy 'adversary' version 0 belongs to the own line of policy 'agent'"):
        line.get(0)
    assert "policy 'adversary' v1" in store.write_back()  # the trainer's own copy goes back
    actor, version, _ = worker.actor("lines-forged", 1, store.lines_of(1))
    assert version == 1


def test_a_task_names_each_policys_version_for_flower():
    spec = TaskSpec("tag-1", "rollout", 4, 0, 12, 1, steps=64, lines={"adversary": 12, "agent": 0})
    assert spec.label().startswith("run=tag-1 v=12 adversary=v12 agent=v0 it=4 idx=0")
    assert TaskSpec.from_kwargs(spec.to_kwargs()) == spec


def test_an_async_run_measures_each_policys_lag_on_its_own_line(farm, tmp_path):
    from .conftest import read_summary, run_cli, train_on

    def train(run_id: str, *extra: str) -> dict:
        sets = ["env.num_envs=6", f"env.policy_map={list(MAP)}", "farm.steps_per_env=100", "eval.episodes=2"]
        options = [part for value in sets for part in ("--set", value)]
        result = train_on(farm, tmp_path, run_id, "--env", ADV, *options, *extra)
        assert result.returncode == 0, result.stderr[-3000:]
        return read_summary(tmp_path / run_id)

    train("lines-first", "--total-steps", "1200")
    trained = tmp_path / "lines-first" / "final_policy.safetensors"
    frozen = f"frozen=['agent={trained}']"
    summary = train("lines-async", "--mode", "async", "--total-steps", "6000", "--set", frozen)  # APPO
    assert summary["env_steps"] >= 6000
    with open(tmp_path / "lines-async" / "progress.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    wanted = {"adversary/policy_lag", "agent/policy_lag", "adversary/policy_version", "agent/policy_version"}
    assert wanted <= set(reader.fieldnames or ())
    assert {row["agent/policy_version"] for row in rows} == {"0"}  # frozen: one version all run long
    adversary = [int(row["adversary/policy_version"]) for row in rows]
    assert adversary[-1] > adversary[0] and adversary == sorted(adversary)
    lags = [float(row["agent/policy_lag"]) for row in rows if row["agent/policy_lag"]]
    assert lags and set(lags) == {0.0}  # never behind on a line that never moves
    client = connect(farm.redis_url)
    assert PolicyStore(client, "lines-async", line="agent").versions() == [0]
    status = run_cli("status", "--json", "--redis", farm.redis_url)
    assert status.returncode == 0, status.stderr
    [run] = [r for r in json.loads(status.stdout)["runs"] if r["run_id"] == "lines-async"]
    assert run["heartbeat"]["lines"]["agent"] == 0 and run["heartbeat"]["lines"]["adversary"] == adversary[-1]


SECRET = "lines-farm-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def signed_farm(tmp_path_factory):
    """Redis and one worker holding the secret; every pool process fetches for itself
    (RLFARM_POLICY_SHARE=off), so a replaced one must fetch the forged version."""
    from rlfarm.local.cluster import LocalCluster

    from .conftest import WORKER_ENV

    env = {**WORKER_ENV, "RLFARM_SECRET": SECRET, "RLFARM_POLICY_SHARE": "off"}
    with LocalCluster(
        workers=1, name="rlfarm-test-lines", log_dir=tmp_path_factory.mktemp("lines"), extra_env=env
    ) as cluster:
        yield cluster


@pytest.mark.fault  # a forged write to Redis, pool processes SIGKILLed
def test_a_forged_version_of_a_frozen_policy_is_refused_written_back_and_the_run_ends_as_without_it(
    signed_farm, tmp_path
):
    """The frozen policy's line holds one version all run long, which a worker fetches once: forged in
    Redis mid-run (zeroed weights, sha256 recomputed) and the pool processes SIGKILLed, their
    replacements fetch it and refuse it; the trainer writes its own copy back and sends the task
    again, and the run ends with the very policy an unattacked one ends with."""
    import os
    import signal
    import subprocess

    from rlfarm.core import codec

    from .conftest import WORKER_ENV, poll, read_summary, run_command, start_command

    url = signed_farm.redis_url
    client = connect(url)
    env = {**os.environ, **WORKER_ENV, "RLFARM_SECRET": SECRET}
    sets = ["env.num_envs=6", f"env.policy_map={list(MAP)}", "farm.num_tasks=2", "farm.steps_per_env=100"]
    sets += ["eval.interval=0", "eval.episodes=2"]
    args = ["--redis", url, "--logdir", str(tmp_path), "--env", ADV]
    args += [part for value in sets for part in ("--set", value)]
    first = run_command("train", "--run-id", "prey", *args, "--total-steps", "1200", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    frozen = ["--set", f"frozen=['agent={tmp_path / 'prey' / 'final_policy.safetensors'}']", "--total-steps", "48000"]
    untouched = run_command("train", "--run-id", "untouched", *args, *frozen, env=env)
    assert untouched.returncode == 0, untouched.stderr[-3000:]

    log = tmp_path / "forged-stderr.txt"
    with open(log, "w") as err:
        proc = start_command(
            "train", "--run-id", "forged", *args, *frozen, env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        key = "rlfarm:forged:policy@agent:0"
        poll(lambda: client.exists(key), "the frozen policy's line version", proc, log)
        state, meta = codec.decode_policy(client.get(key), SECRET)
        client.set(key, codec.encode_policy({k: torch.zeros_like(v) for k, v in state.items()}, meta))
        main_pid = signed_farm.worker_procs[0].pid
        pool = subprocess.run(["ps", "-o", "pid=", "--ppid", str(main_pid)], capture_output=True, text=True).stdout
        for pid in map(int, pool.split()):  # their replacements have no copy of the frozen policy
            os.kill(pid, signal.SIGKILL)
        refused = "policy 'agent' version 0 is corrupt: policy blob has a bad signature"
        poll(lambda: refused in log.read_text(), "the forged version refused", proc, log)
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert "wrote back policy 'agent' v0 from the trainer's own copy" in stderr, stderr[-3000:]
    summary, baseline = read_summary(tmp_path / "forged"), read_summary(tmp_path / "untouched")
    assert summary["security"]["refused_policy"] >= 1
    assert summary["env_steps"] == baseline["env_steps"]
    assert summary["policy_sha256"] == baseline["policy_sha256"]  # learned exactly what it would have
    PolicyStore(client, "forged", secret=SECRET, line="agent").get(0)  # the genuine one is back

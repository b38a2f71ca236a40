"""Writes to Redis by someone without the farm's secret, done for real against running runs.

- A forged blob is never pinned, nor re-signed into best_policy.safetensors (item 3).
- With RLFARM_SECRET, what workers refuse (a forged policy, a tampered task, forged run metadata) is
  counted, warned about, written back from the trainer's own copy and sent again: the run goes on
  and ends as it would have without the attack (item 2).
- Without a secret set by the user, the embedded default and `rlfarm up` make one, and a trainer or
  worker on a Redis elsewhere without RLFARM_SECRET says so (item 10).
"""

from __future__ import annotations

import os

import pytest
import torch

from rlfarm.core import codec
from rlfarm.core.protocol import TASK_QUEUE
from rlfarm.errors import PolicyCorrupt
from rlfarm.farm.connection import connect
from rlfarm.farm.policies.store import PolicyStore

# One test process runs the module, so its module-scoped run (or farm) is made once, not once on
# every test process that gets one of its tests (conftest.py sends grouped modules early).
pytestmark = pytest.mark.xdist_group("signed-worker")

SECRET = "tamper-secret-0123456789abcdef"
# What workers answer a forged task spec, policy and run metadata (in the trainer's warnings and in
# each refused task's task-failed event).
REFUSALS = ("task spec has a bad signature", "policy blob has a bad signature", "metadata in Redis is not signed")


def _zeroed(state):
    return {k: torch.zeros_like(v) for k, v in state.items()}


@pytest.mark.farm
@pytest.mark.fault  # forged writes to Redis
def test_a_forged_blob_is_never_pinned_nor_signed_into_best_policy(redis_only, tmp_path, monkeypatch):
    """The trainer pins the version it evaluates and writes the best one to best_policy.safetensors,
    signed. A blob written over that version in Redis (zeroed weights, sha256 recomputed, the genuine
    hmac kept) must not become a validly signed best policy: the trainer uses its own copy."""
    from rlfarm.api import make_config
    from rlfarm.config import to_dict
    from rlfarm.core.protocol import Result
    from rlfarm.observe.metrics import RunLogger
    from rlfarm.trainer import make_trainer

    monkeypatch.setenv("RLFARM_SECRET", SECRET)
    cfg = make_config("cartpole-ppo", run_id="pin-forged", logdir=str(tmp_path))
    trainer = make_trainer(cfg, redis_only.redis_url, tmp_path / "pin-forged")
    trainer.logger = RunLogger(tmp_path / "pin-forged", to_dict(cfg), cfg.total_steps, tensorboard=False)
    trainer.publish()  # v0
    genuine = trainer.algo.state()

    client = connect(redis_only.redis_url)  # the attacker: can write to Redis, has no secret
    key = "rlfarm:pin-forged:policy:0"
    _, meta = codec.decode_policy(client.get(key))
    client.set(key, codec.encode_policy(_zeroed(genuine), meta))

    trainer.evaluate()  # pins v0 for its evaluation tasks
    for index in range(cfg.eval.tasks):
        trainer.handle_eval(Result("eval", 0, index, version=0, returns=[10.0]))
    assert trainer.evals.best_version == 0
    state, best = codec.decode_policy((tmp_path / "pin-forged" / "best_policy.safetensors").read_bytes(), SECRET)
    assert best["version"] == "0"
    for name, tensor in genuine.items():  # the trainer's weights, not the forged zeros
        assert torch.equal(state[name], tensor.cpu()), name
    assert any(t.abs().sum() > 0 for t in state.values())

    # A store that did not publish v0 itself (a resumed trainer) checks what it pins: refused.
    with pytest.raises(PolicyCorrupt, match="policy version 0 is corrupt: policy blob has a bad signature"):
        PolicyStore(client, "pin-forged").pin(0)
    trainer.logger.close()


# ---- without a secret set by the user (item 10) ------------------------------------------------------


def _queued_tasks(client, run_id: str) -> list[tuple[int, dict]]:
    """(index in the broker list, kwargs) of the run's task messages waiting in the queue, read as
    anyone who can reach Redis reads them (kombu: JSON envelope, base64 msgpack body)."""
    import base64
    import json

    import msgpack

    found = []
    for i, raw in enumerate(client.lrange(TASK_QUEUE, 0, -1)):
        try:
            _, kwargs, _ = msgpack.unpackb(base64.b64decode(json.loads(raw)["body"]), raw=False)
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(kwargs, dict) and kwargs.get("run") == run_id:
            found.append((i, kwargs))
    return found


@pytest.mark.farm
@pytest.mark.fault  # forged writes to Redis
def test_embedded_default_signs_by_itself_and_drops_a_forged_result(tmp_path, monkeypatch):
    """`rlfarm train` without --redis and without RLFARM_SECRET: while a task waits in the queue, a
    local process that can reach the embedded Redis pushes a result for it (a real rollout of the
    run's policy, rewards x100). Without a secret it counted as the task's first copy and the
    genuine one was dropped as a duplicate, silently; now the run made a secret of its own, so the
    forgery is dropped, counted and warned about, and the genuine result counts."""
    import json
    import subprocess

    import redis

    from rlfarm.core import codec
    from rlfarm.core.protocol import TaskSpec
    from rlfarm.farm import keys
    from rlfarm.worker.handler import TaskHandler

    from .conftest import WORKER_ENV, poll, start_command

    run_id = "embedded-forged"
    env = {**os.environ, **WORKER_ENV}
    env.pop("RLFARM_SECRET", None)
    monkeypatch.delenv("RLFARM_SECRET", raising=False)
    monkeypatch.setenv("RLFARM_ALLOWED_ENV_MODULES", "tests.tiny_envs")  # the forger builds the env too
    err = open(tmp_path / "stderr.txt", "w")
    # One worker process, 4 tasks of ~0.3 s each per iteration: three of them wait in the queue.
    proc = start_command(
        "train",
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--workers",
        "1",
        "--env",
        "tests.tiny_envs:long_slow",
        "--total-steps",
        "8192",
        "--set",
        "farm.num_tasks=4",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=256",
        "--set",
        "ppo.num_minibatches=2",
        "--set",
        "eval.episodes=2",
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    run_dir = tmp_path / run_id
    try:
        url = poll(
            lambda: (
                (run_dir / "cluster.json").exists() and json.loads((run_dir / "cluster.json").read_text())["redis_url"]
            ),
            "the embedded Redis's URL",
            proc,
            tmp_path / "stderr.txt",
        )
        client = redis.Redis.from_url(url)
        _, kwargs = poll(
            lambda: _queued_tasks(client, run_id),
            "a task of the run waiting in the queue",
            proc,
            tmp_path / "stderr.txt",
        )[0]
        # The forgery: a real rollout of the run's current policy, its rewards x100.
        forged = TaskHandler(url).rollout(TaskSpec.from_kwargs({k: v for k, v in kwargs.items() if k != "sig"}))
        forged.rollout["rewards"] = forged.rollout["rewards"] * 100
        forged.task_id = "forged"

        def pushed_while_queued() -> bool:
            """Pushed as the result of a task still waiting in the queue (atomic with seeing it
            there, so its genuine result cannot be first); False: none queued, or the queue moved."""
            with client.pipeline() as pipe:
                try:
                    pipe.watch(TASK_QUEUE)
                    waiting = _queued_tasks(pipe, run_id)
                    if not waiting:
                        return False
                    forged.iteration, forged.index = waiting[0][1]["iteration"], waiting[0][1]["index"]
                    pipe.multi()
                    pipe.rpush(keys.results(run_id), codec.pack(forged.to_message()))
                    pipe.execute()
                    return True
                except redis.WatchError:
                    return False

        poll(pushed_while_queued, "a forged result pushed while its task waits", proc, tmp_path / "stderr.txt")
        assert proc.wait(timeout=900) == 0, (tmp_path / "stderr.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "forged" not in summary["accepted_task_ids"]
    assert summary["env_steps"] == 8192 and summary["security"]["refused_result"] == 1
    stderr = (tmp_path / "stderr.txt").read_text()
    warned = [line for line in stderr.splitlines() if "rlfarm: warning: dropped a result of run" in line]
    assert len(warned) == 1 and "is not signed, but this farm signs its data" in warned[0], stderr[-3000:]
    assert "RLFARM_SECRET is set" not in stderr  # the user set none: the embedded farm made its own
    assert "dropped a result of run" in (run_dir / "rlfarm.log").read_text()


@pytest.mark.parametrize(
    "url, secret, warned",
    [
        ("redis://127.0.0.1:6379/0", None, False),
        ("redis://localhost/0", None, False),
        ("unix:///run/redis.sock", None, False),
        ("redis://[::1]:6379/0", None, False),
        ("redis://:pw@10.0.0.5:6379/0", None, True),
        ("rediss://u:pw@redis-host:6380/0", None, True),
        ("redis://:pw@10.0.0.5:6379/0", b"s", False),
        ("rediss://u:pw@redis-host:6380/0", "s", False),
    ],
)
def test_no_secret_warning_names_a_redis_off_this_machine_without_rlfarm_secret(url, secret, warned):
    from rlfarm.farm.connection import no_secret_warning

    text = no_secret_warning(url, secret)
    assert (text is not None) == warned
    if warned:
        assert "RLFARM_SECRET is not set" in text and "pw@" not in text  # the password stays redacted


@pytest.mark.farm
@pytest.mark.fault  # forged writes to Redis
def test_trainer_and_worker_on_a_redis_elsewhere_without_a_secret_warn_once(farm, tmp_path):
    """A real `rlfarm worker` and a real `rlfarm train` given a Redis URL that is not a loopback
    address, without RLFARM_SECRET, each warn once at start. `127.1` is 127.0.0.1 to the resolver
    (inet_aton) but not a loopback address by rlfarm's reading of the URL: how a Redis on another
    machine looks, reachable here without leaving 127.0.0.1."""
    import signal
    import subprocess

    from rlfarm.local.cluster import LocalCluster

    from .conftest import WORKER_ENV, poll, rlfarm_cmd, run_cli

    env = {**os.environ, **WORKER_ENV}
    env.pop("RLFARM_SECRET", None)
    with LocalCluster(workers=0, name="rlfarm-test-elsewhere", log_dir=tmp_path) as cluster:
        url = f"redis://127.1:{cluster.port}/0"
        log = tmp_path / "worker.txt"
        with open(log, "w") as out:
            worker = subprocess.Popen(
                rlfarm_cmd("worker", "--redis", url, "-c", "1"),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            poll(lambda: "ready." in log.read_text(), "the worker to start", worker, log)
        finally:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        warned = [line for line in log.read_text().splitlines() if "RLFARM_SECRET is not set" in line]
        assert len(warned) == 1 and f"Redis at {url} is not on this machine" in warned[0], log.read_text()

    url = farm.redis_url.replace("127.0.0.1", "127.1")
    result = run_cli(
        "train",
        "--redis",
        url,
        "--run-id",
        "elsewhere",
        "--logdir",
        str(tmp_path),
        "--total-steps",
        "1024",
        "--set",
        "farm.num_tasks=2",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=512",
        "--set",
        "ppo.num_minibatches=2",
        env={"RLFARM_SECRET": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    warned = [line for line in result.stderr.splitlines() if "RLFARM_SECRET is not set" in line]
    assert warned == [
        f"rlfarm: warning: Redis at {url} is not on this machine and RLFARM_SECRET is not set: "
        f"whoever can write to it can forge results, policies and tasks unnoticed; give the "
        f"trainer and every worker the same secret in RLFARM_SECRET (e.g. `openssl rand -hex 32`)"
    ]
    assert "RLFARM_SECRET is not set" in (tmp_path / "elsewhere" / "rlfarm.log").read_text()


# ---- with RLFARM_SECRET: one forged write no longer ends the run (item 2) -----------------------------


def _pool_pids(main_pid: int) -> list[int]:
    import subprocess

    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(main_pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


@pytest.fixture(scope="module")
def signed_worker(tmp_path_factory):
    """Redis and one worker process holding the secret (and allowed the tiny envs). Every process
    fetches each version from Redis itself (RLFARM_POLICY_SHARE=off): the forged policy below reaches
    a worker by killing its pool process, whose replacement would otherwise read the machine's checked
    copy of the version (rlfarm.farm.policies.machine; its own checks: tests/test_machine.py)."""
    from rlfarm.local.cluster import LocalCluster

    from .conftest import WORKER_ENV

    env = {**WORKER_ENV, "RLFARM_SECRET": SECRET, "RLFARM_POLICY_SHARE": "off"}
    with LocalCluster(
        workers=1, name="rlfarm-test-tamper", log_dir=tmp_path_factory.mktemp("tamper"), extra_env=env, events=True
    ) as cluster:  # events: what Flower shows of each task
        yield cluster


@pytest.mark.farm
@pytest.mark.fault  # forged writes to Redis
def test_forged_policy_task_and_meta_are_refused_written_back_and_the_run_ends_as_without_them(signed_worker, tmp_path):
    """A SYNC run on a farm with RLFARM_SECRET, attacked three times while it trains by a process that
    can write to Redis but has no secret: one queued task's message rewritten (seed + 1); the newest
    policy replaced by zeroed weights with a recomputed sha256 (a pool process then SIGKILLed, so its
    replacement must fetch it); the run metadata replaced by an unsigned one whose env is `os:system`
    (a pool process SIGKILLed again). Workers refuse each; the trainer counts and warns, writes back
    its own copy, sends the task again, and ends with the very policy an unattacked run ends with.
    Each refused task is FAILURE in Celery (its `task-failed` event, what Flower shows), not SUCCESS."""
    import base64
    import json
    import signal
    import subprocess

    import msgpack
    import redis

    from .conftest import WORKER_ENV, TaskEvents, poll, read_csv, read_summary, run_command, start_command

    url = signed_worker.redis_url
    client = connect(url)
    args = [
        "--redis",
        url,
        "--logdir",
        str(tmp_path),
        "--env",
        "tests.tiny_envs:long_slow",
        "--total-steps",
        str(4 * 256 * 40),
        "--set",
        "farm.num_tasks=4",
        "--set",
        "env.num_envs=1",
        "--set",
        "farm.steps_per_env=256",
        "--set",
        "ppo.num_minibatches=2",
        "--set",
        "farm.lease_seconds=2",
        # The final evaluation only, short: one 1-s episode a task on the one worker process.
        "--set",
        "eval.interval=0",
        "--set",
        "eval.episodes=2",
    ]
    env = {**os.environ, **WORKER_ENV, "RLFARM_SECRET": SECRET}

    baseline = run_command("train", "--run-id", "untouched", *args, env=env, timeout=900)
    assert baseline.returncode == 0, baseline.stderr[-3000:]

    run_id = "tampered"
    run_dir = tmp_path / run_id
    log = tmp_path / "tampered-stderr.txt"
    events = TaskEvents(url)
    events.__enter__()  # listening before the run's first task (left in the `finally` below)
    with open(log, "w") as err:
        proc = start_command("train", "--run-id", run_id, *args, env=env, stdout=subprocess.DEVNULL, stderr=err)
    main_pid = signed_worker.worker_procs[0].pid

    def warned(what: str) -> bool:
        return any("was refused on" in line and what in line for line in log.read_text().splitlines())

    try:
        # 1. A task waiting in the queue, its seed changed (kombu: JSON envelope, base64 msgpack body).
        def tamper_a_queued_task() -> bool:
            with client.pipeline() as pipe:
                try:
                    pipe.watch(TASK_QUEUE)
                    for i, raw in enumerate(pipe.lrange(TASK_QUEUE, 0, -1)):
                        message = json.loads(raw)
                        task_args, kwargs, embed = msgpack.unpackb(base64.b64decode(message["body"]), raw=False)
                        if kwargs.get("run") != run_id:
                            continue
                        kwargs["seed"] += 1
                        message["body"] = base64.b64encode(
                            msgpack.packb([task_args, kwargs, embed], use_bin_type=True)
                        ).decode()
                        pipe.multi()
                        pipe.lset(TASK_QUEUE, i, json.dumps(message))
                        pipe.execute()
                        return True
                except redis.WatchError:
                    pass
            return False

        poll(tamper_a_queued_task, "a queued task of the run to rewrite", proc, log)
        poll(lambda: warned("task spec has a bad signature"), "the tampered task refused", proc, log)

        # 2. The newest policy: zeroed weights, sha256 recomputed, the genuine metadata (hmac) kept.
        forged_at: list[int] = []

        def policy_refused() -> bool:
            if warned("policy blob has a bad signature"):
                return True
            latest = int(client.get(f"rlfarm:{run_id}:policy:latest"))
            if latest not in forged_at:  # the trainer moved on before any worker fetched it: again
                key = f"rlfarm:{run_id}:policy:{latest}"
                state, meta = codec.decode_policy(client.get(key))
                client.set(key, codec.encode_policy(_zeroed(state), meta))
                forged_at.append(latest)
                for pid in _pool_pids(main_pid):  # its replacement has no cached policy: it fetches
                    os.kill(pid, signal.SIGKILL)
            return False

        poll(policy_refused, "the forged policy refused", proc, log)

        # 3. The run metadata, unsigned, naming another env; then a new pool process must read it.
        meta = PolicyStore(client, run_id, secret=None).run_meta()
        meta["config"]["env"]["id"] = "os:system"
        PolicyStore(client, run_id, secret=None).set_run_meta(meta)
        for pid in _pool_pids(main_pid):
            os.kill(pid, signal.SIGKILL)
        poll(lambda: warned("metadata in Redis is not signed"), "the forged metadata refused", proc, log)
        assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]

        # A task's event follows its answer to the trainer (the worker's main process sends it once
        # the task returns): waited for. Each refusal is FAILURE, the tasks that ran SUCCESS.
        def refusals_failed() -> bool:
            failed = list(events.failed().values())
            return all(any(why in e and e.startswith("TaskFailed(") for e in failed) for why in REFUSALS)

        poll(refusals_failed, "a task-failed event for each refusal")
        succeeded = {e["uuid"] for e in events.of("task-succeeded")}
        assert succeeded and not succeeded & set(events.failed())
    finally:
        events.__exit__()
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    summary, untouched = read_summary(run_dir), read_summary(tmp_path / "untouched")
    assert summary["security"]["refused_spec"] >= 1 and summary["security"]["refused_policy"] >= 1
    assert summary["security"]["refused_meta"] >= 1 and summary["security"]["refused_result"] == 0
    assert summary["env_steps"] == untouched["env_steps"]
    assert summary["policy_sha256"] == untouched["policy_sha256"]  # learned exactly what it would have
    last = read_csv(run_dir / "progress.csv")[-1]
    assert int(float(last["security/refused_policy"])) == summary["security"]["refused_policy"]
    stderr = log.read_text()
    assert "rlfarm: error" not in stderr
    assert any("wrote back policy v" in line for line in stderr.splitlines() if "was refused on" in line), stderr
    assert any("wrote back the run metadata" in line for line in stderr.splitlines()), stderr
    # What the run leaves in Redis is the trainer's again: signed metadata naming its env, a verified policy.
    assert PolicyStore(client, run_id, secret=SECRET).run_meta()["config"]["env"]["id"] == "tests.tiny_envs:long_slow"
    PolicyStore(client, run_id, secret=SECRET).get("latest")

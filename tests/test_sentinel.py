"""Redis Sentinel: a farm whose master is lost (SIGKILL) fails over to its replica mid-run, and the
trainer, both kinds of worker, `rlfarm status` and Flower follow it, with nothing counted twice.

Real processes on 127.0.0.1: a master, a replica and three sentinels (tests/sentinel.py), an
`rlfarm worker` and a plain `celery -A tasks worker`, the `rlfarm train` command.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import redis

from rlfarm.core.protocol import TASK_QUEUE
from rlfarm.farm.app import celery_settings, make_app
from rlfarm.farm.connection import no_password_warning, no_secret_warning, redact
from rlfarm.farm.redis_url import celery_transport, parse_sentinel
from rlfarm.local.cluster import LOOPBACK, free_port, stop_process_group

from .conftest import (
    ROOT,
    WORKER_ENV,
    http_request,
    make_run,
    poll,
    read_summary,
    run_command,
    start_command,
    task_channel,
    task_specs,
)
from .sentinel import SentinelFarm
from .test_faults import (
    CELERY_WORKER,
    RLFARM_WORKER,
    SLOW_DQN,
    SLOW_PPO,
    assert_nothing_lost_or_double_counted,
    progress_rows,
    wait_for_rows,
)

# ---- the URL (unit) ------------------------------------------------------------------------------
URL = "sentinel://:s3cret@h1:26379;sentinel://h2;sentinel://10.0.0.3:26380/2?master_name=farm"


def test_a_sentinel_url_names_the_sentinels_master_db_and_password():
    target = parse_sentinel(URL)
    assert target.sentinels == (("h1", 26379), ("h2", 26379), ("10.0.0.3", 26380))
    assert (target.master_name, target.db, target.password) == ("farm", 2, "s3cret")
    broker, options = celery_transport(URL)
    assert broker == "sentinel://:s3cret@h1:26379/2;sentinel://:s3cret@h2:26379/2;sentinel://:s3cret@10.0.0.3:26380/2"
    assert options == {"master_name": "farm"}
    settings = celery_settings(URL)
    assert settings["broker_transport_options"]["master_name"] == "farm"
    assert settings["broker_transport_options"]["visibility_timeout"] == 3600
    assert celery_transport("redis://h:1/0") == ("redis://h:1/0", {})


@pytest.mark.parametrize(
    "url, error",
    [
        ("sentinel://h1:26379;sentinel://h2:26379/0", "master_name"),
        ("sentinel://h1:26379;redis://h2:6379/0?master_name=m", "starts with sentinel://"),
        ("sentinel://h1:26379/x?master_name=m", "db"),
        ("sentinel://h1:26379/0?master=m", "unknown Sentinel URL parameter 'master'"),
    ],
)
def test_a_bad_sentinel_url_says_what_is_wrong(url, error):
    with pytest.raises(ValueError, match=error):
        parse_sentinel(url)


def test_a_sentinel_url_is_redacted_and_warned_about_like_a_plain_one():
    assert "s3cret" not in redact(URL) and redact(URL).count("sentinel://") == 3
    assert no_password_warning(URL) is None  # it has one
    remote = "sentinel://h1:26379;sentinel://h2:26379/0?master_name=m"
    assert "without a password" in no_password_warning(remote)
    assert "RLFARM_SECRET" in no_secret_warning(remote, None)
    local = "sentinel://127.0.0.1:26379;sentinel://localhost:26380/0?master_name=m"
    assert no_password_warning(local) is None and no_secret_warning(local, None) is None
    mixed = "sentinel://127.0.0.1:26379;sentinel://h2:26379/0?master_name=m"
    assert no_password_warning(mixed) is not None


def test_unreachable_sentinels_and_bad_urls_are_one_clear_line():
    from rlfarm.farm.connection import connect

    with pytest.raises(ConnectionError, match="no sentinel there names a master 'farm'"):
        connect("sentinel://127.0.0.1:1;sentinel://127.0.0.1:2/0?master_name=farm", timeout=1)
    with pytest.raises(ConnectionError, match="bad Redis URL sentinel://127.0.0.1:1/0: .*master_name"):
        connect("sentinel://127.0.0.1:1/0")
    with pytest.raises(ConnectionError, match="starts with redis://, rediss://, unix:// or sentinel://"):
        connect("http://127.0.0.1:1/0")


# ---- failover on a real farm -------------------------------------------------------------------
def _farm(tmp_path, events: bool = False) -> SentinelFarm:
    farm = SentinelFarm(
        tmp_path,
        name=f"rlfarm-sentinel-{os.getpid()}",
        events=events,
        extra_env={**WORKER_ENV, "RLFARM_REDIS_OUTAGE_TIMEOUT": "300"},
    )
    try:
        farm.start()
        farm.add_worker(1, command=[*RLFARM_WORKER, *(["-E"] if events else [])])
        if not events:
            farm.add_worker(1, command=CELERY_WORKER)
    except BaseException:
        farm.stop()
        raise
    return farm


def _answering(url: str, expected: int) -> bool:
    """`expected` worker nodes answer a broadcast ping sent through the sentinels."""
    app = make_app(url)
    try:
        return len(app.control.ping(timeout=1.0)) == expected
    except Exception:  # noqa: BLE001 - a connection from before the failover fails once
        return False
    finally:
        app.close()


def _train(farm, tmp_path, run_id: str, *args: str) -> subprocess.Popen:
    """`rlfarm train` on the Sentinel farm, with leases short enough to notice a lost worker quickly."""
    return start_command(
        "train", "--redis", farm.redis_url, "--run-id", run_id, "--logdir", str(tmp_path), *args,
        "--set", "farm.lease_seconds=3",
        env={**os.environ, **WORKER_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.farm
@pytest.mark.fault
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_master_killed_mid_run_fails_over_and_the_run_finishes_with_nothing_counted_twice(tmp_path, mode):
    """SIGKILL the master mid-run: the sentinels promote the replica, and the trainer, the policy store,
    results, leases and both workers' brokers follow it. Writes the replica had not yet copied are
    lost; the trainer re-lists its pending tasks, writes its newest policy back, and re-sends what
    was lost. Prints the stall: the trainer's outage and the longest gap between iterations."""
    farm = _farm(tmp_path)
    try:
        run_id = f"failover-{mode}"
        args = SLOW_PPO + ["--total-steps", "5000"] if mode == "sync" else SLOW_DQN + ["--total-steps", "4000"]
        proc = _train(farm, tmp_path, run_id, *args)
        wait_for_rows(proc, tmp_path / run_id, rows=2)
        old = farm.group.kill_master()
        poll(lambda: farm.group.master_port() not in (None, old), "the sentinels promoted the replica")
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr
        assert "rlfarm: warning: lost Redis at" in stderr and "is back after" in stderr
        s = read_summary(tmp_path / run_id)
        assert s["faults"]["redis_outages"] >= 1
        assert s["env_steps"] >= (5000 if mode == "sync" else 4000)
        assert_nothing_lost_or_double_counted(s, 250)
        # Both workers consume from the new master: they answer a ping sent through the sentinels.
        poll(lambda: _answering(farm.redis_url, 2), "both workers answering after the failover")
        assert all(p.poll() is None for p in farm.worker_procs)
        times = [float(r["wall_time"]) for r in progress_rows(tmp_path / run_id)]
        gaps = [b - a for a, b in zip(times, times[1:])]
        print(
            f"\n{mode}: trainer outage {s['faults']['redis_outage_seconds']:.1f} s over "
            f"{s['faults']['redis_outages']} outage(s); longest gap between iterations {max(gaps):.1f} s, "
            f"median {statistics.median(gaps):.1f} s; re-sent {s['faults']}"
        )
    finally:
        farm.stop()


def _get(url: str, auth: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(http_request(url, auth), timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError):
        return 0, b""


@pytest.mark.farm
@pytest.mark.fault
def test_status_and_flower_follow_a_failover(tmp_path):
    farm = _farm(tmp_path, events=True)
    auth = f"rlfarm:{secrets.token_urlsafe(12)}"
    port = free_port()
    base = f"http://{LOOPBACK}:{port}"
    env = {**os.environ, **WORKER_ENV, "RLFARM_REDIS_URL": farm.redis_url, "FLOWER_BASIC_AUTH": auth}
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    flower = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--port={port}", f"--address={LOOPBACK}"],
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / "flower.log", "wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def flower_sees(what: str) -> bool:
            status, body = _get(f"{base}/workers?json=1", auth)
            if status != 200 or not [w for w in json.loads(body)["data"] if w.get("status")]:
                return False
            status, body = _get(f"{base}/api/queues/length", auth)  # Flower's broker view, through Sentinel
            return status == 200 and TASK_QUEUE in body.decode()

        poll(lambda: flower_sees("before"), "Flower sees the worker and the queue", flower, tmp_path / "flower.log")

        def status_json() -> dict:
            out = run_command("status", "--json", "--redis", farm.redis_url, env={**os.environ, **WORKER_ENV})
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        before = status_json()
        assert len(before["workers"]) == 1 and "sentinel://" in before["redis"]
        old = farm.group.kill_master()
        killed_at = time.time()  # Flower records when it heard a heartbeat, on this machine's clock
        poll(lambda: farm.group.master_port() not in (None, old), "the sentinels promoted the replica")
        # A fresh process asks the sentinels for the new master; the worker answers it once its
        # consumer has reconnected (Celery retries after 2 s, then 4 s).
        after = poll(
            lambda: (lambda snap: snap if len(snap["workers"]) == 1 else None)(status_json()),
            "the worker in `rlfarm status` after the failover",
        )
        assert after["redis"] == before["redis"]

        # Flower's event consumer reconnects by itself, with kombu's back-off (2 s, 4 s, 6 s, ...):
        # task events sent before it is back are gone (they are pub/sub), so the task waits for it
        # to hear the worker's heartbeat (every 2 s) from the new master.
        def flower_hears_the_worker_again() -> bool:
            status, body = _get(f"{base}/workers?json=1", auth)
            beats = [max(w.get("heartbeats") or [0]) for w in json.loads(body)["data"]] if status == 200 else []
            return bool(beats) and max(beats) > killed_at

        poll(
            flower_hears_the_worker_again,
            "a worker heartbeat in Flower after the failover",
            flower,
            tmp_path / "flower.log",
        )
        # A task sent after the failover runs, and Flower, whose event consumer and broker view
        # reconnected to the new master by themselves, shows it.
        make_run(farm.redis_url, "flower-failover")
        d = task_channel(farm.redis_url, "flower-failover")
        [result] = d.gather_group(task_specs(0, 1, 32))
        assert result.error is None

        def flower_shows_task() -> bool:
            status, body = _get(f"{base}/api/tasks", auth)
            return status == 200 and result.task_id in json.loads(body)

        poll(flower_shows_task, "the task sent after the failover in Flower", flower, tmp_path / "flower.log")
        assert flower_sees("after")
    finally:
        stop_process_group(flower, grace=5.0)
        farm.stop()


@pytest.mark.farm
@pytest.mark.fault
def test_writes_a_promoted_replica_lacks_are_put_back_or_re_sent(tmp_path):
    """On loopback the replica is seldom behind, so the loss is made by hand: the newest writes a
    failover can lose (the trainer's newest policy version, the `wanted` entries and messages of the
    tasks sent last) are deleted, and Redis goes away for a second while the task channel talks to it
    (SIGTERM, then started again from its append-only file). After the outage the watchdog
    re-lists its tasks, the trainer's copy of the newest version is written back, and the lost
    messages are re-sent: nothing waits forever."""
    import threading

    from rlfarm.farm import keys
    from rlfarm.farm.app import CELERY_QUEUE
    from rlfarm.farm.outage import OutageRetry, resilient_client
    from rlfarm.local.cluster import LocalCluster, RedisSpec
    from rlfarm.trainer.channel import FarmLink
    from rlfarm.trainer.dispatch import Unowned

    with LocalCluster(
        workers=0,
        name="rlfarm-lost-writes",
        log_dir=tmp_path,
        redis=RedisSpec(
            args=(
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            )
        ),
    ) as cluster:
        url = cluster.redis_url
        _, store = make_run(url, "lost-writes", versions=3)
        retry = OutageRetry(60.0)

        class Owner(Unowned):  # what this test needs of the trainer: its newest version written back
            def after_outage(self):
                store.restore_newest()

        d = FarmLink(
            make_app(url), resilient_client(url, retry), "lost-writes", 60.0, 3, lease_seconds=1.0, retry=retry
        ).open(owner=Owner())
        d.submit_many([dict(s, version=2) for s in task_specs(0, 2, 32)])
        admin = redis.Redis.from_url(url)
        assert admin.llen(CELERY_QUEUE) == 2
        # What the promoted replica lacks: the newest version and the last tasks' entries and messages.
        admin.delete(keys.policy("lost-writes", 2), keys.wanted("lost-writes"), CELERY_QUEUE)
        admin.set(keys.latest("lost-writes"), 1)
        cluster.stop_redis(signal.SIGTERM)
        checking = threading.Thread(target=d.check, kwargs={"force": True})  # waits the outage out
        checking.start()
        poll(lambda: retry.outage_started is not None, "the watchdog meeting the outage")
        cluster.start_redis(same_port=True)
        checking.join()
        assert retry.outages == 1
        assert store.latest() == 2 and store.get_blob(2) == store.own[1]  # written back, as published
        texts = {keys.task(*k) for k in d.pending}
        assert texts <= {m.decode() for m in admin.smembers(keys.wanted("lost-writes"))}  # re-listed
        poll(lambda: d.check(force=True) or d.stats.messages_lost == 2, "both lost messages re-sent")
        assert admin.llen(CELERY_QUEUE) == 2 and d.stats.redispatched == 2
        d.finish()


# ---- a failover during an ack ----------------------------------------------------------------------
def test_a_settlement_knows_when_its_broker_connection_is_gone(redis_only, caplog):
    """The guard on a task message's ack (rlfarm.worker.hooks.guard_settlement) reads kombu's Message,
    Channel and Transport. The worker's crash, replayed in kombu's order: a lost connection's
    teardown detaches the transport from its kombu Connection (`Transport.client = None`) and closes
    the channels; a channel closed after that (the teardown of another failed first) puts its
    unacked messages back ("Restoring 1 unacknowledged message(s)") through a pool it can no longer
    build, and is left without one; the late ack of a task that ran meanwhile raised
    AttributeError("'NoneType' object has no attribute 'hostname'") in the consumer's event loop. This
    test fails loudly if a kombu release changes any of it; the guarded ack logs one line instead."""
    import logging

    import kombu

    from rlfarm.worker.hooks import STALE_SETTLEMENT, connection_gone, guard_settlement

    assert (5, 4) <= kombu.VERSION[:2] < (5, 8), "setup.cfg's kombu bounds: re-check this guard before moving them"
    with kombu.Connection(redis_only.redis_url) as conn:
        queue = conn.SimpleQueue(f"rlfarm-settle-{os.getpid()}")
        queue.put({"n": 1}, serializer="json")
        message = queue.get(timeout=10)
        guard_settlement(message, "task-1")
        assert not connection_gone(message)
        message.channel.connection.client = None  # kombu.Connection._do_close_transport, first
        with pytest.raises(AttributeError, match="hostname"):
            message.channel.close()  # the restore of its unacked message cannot build a pool
        assert connection_gone(message)
        with pytest.raises(AttributeError, match="hostname"):
            type(message).ack(message)  # kombu's ack, unguarded: what killed the worker's consumer
        with caplog.at_level(logging.WARNING, logger="rlfarm.worker"):
            message.ack()
        lines = [r.getMessage() for r in caplog.records if STALE_SETTLEMENT in r.getMessage()]
        assert len(lines) == 1 and "AttributeError" in lines[0] and "task-1" in lines[0]


FAILOVERS = 3


@pytest.mark.farm
@pytest.mark.fault
def test_workers_ride_out_failovers_while_tasks_are_acked(tmp_path):
    """An ASYNC DQN run whose master is SIGKILLed three times (each lost master comes back as a
    replica, so the next failover can happen): every failover cuts off tasks that are running, whose
    acks then go to a broker connection the worker replaced. Both workers keep consuming (the run
    finishes, both answer a ping), and their logs show the guarded acks
    (rlfarm.worker.hooks.STALE_SETTLEMENT): the window was hit."""
    from rlfarm.worker.hooks import STALE_SETTLEMENT

    farm = _farm(tmp_path)
    try:
        run_id = "failover-acks"
        proc = _train(farm, tmp_path, run_id, *SLOW_DQN, "--total-steps", "12000")
        rows = 1
        for _ in range(FAILOVERS):
            wait_for_rows(proc, tmp_path / run_id, rows=rows)  # training, tasks running and acked
            old = farm.group.kill_master()
            poll(lambda old=old: farm.group.master_port() not in (None, old), "the sentinels promoted the replica")
            farm.group.revive(old)
            rows = len(progress_rows(tmp_path / run_id)) + 1  # tasks done after this failover
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        s = read_summary(tmp_path / run_id)
        assert s["faults"]["redis_outages"] >= FAILOVERS and s["env_steps"] >= 12000
        assert_nothing_lost_or_double_counted(s, 250)
        poll(lambda: _answering(farm.redis_url, 2), "both workers answering after the failovers")
        assert all(p.poll() is None for p in farm.worker_procs)
        logs = [(tmp_path / f"worker-{i}.log").read_text(errors="replace") for i in range(2)]
        assert not [log for log in logs if "Unrecoverable error" in log]
        hits = [log.count(STALE_SETTLEMENT) for log in logs]
        guarded = [log.count(f"{STALE_SETTLEMENT} ack") - log.count("sent on a new connection") for log in logs]
        print(f"\nacks on a replaced connection per worker: {hits}; of them not sendable (kombu's crash): {guarded}")
        assert sum(hits) >= 1, "no task was acked across a failover: the window was not hit"
    finally:
        farm.stop()

"""Fair shares between runs training on one farm at once (rlfarm.core.shares, rlfarm.farm.shares).

The allocation is pure and tested here case by case and by its properties; the mechanism with real
redis-server, `celery worker` and `rlfarm train` processes: registration, caps in proportion to the
weights, a SIGKILLed trainer's share returning to the others, and a SYNC group sent in waves still
giving the same policy. The fractions of slot time each run gets are benchmarks/shares.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess

import pytest

from rlfarm.core import codec
from rlfarm.core.shares import Demand, allocate, used_fraction

from .conftest import WORKER_ENV, poll, run_cli, start_command


# ---- the allocation, pure ---------------------------------------------------------------------
def test_equal_weights_split_the_slots_evenly():
    assert allocate(8, {"a": Demand(1, 8), "b": Demand(1, 8)}) == {"a": 4, "b": 4}


def test_weights_3_to_1_give_3_to_1():
    assert allocate(4, {"a": Demand(3, 8), "b": Demand(1, 8)}) == {"a": 3, "b": 1}
    assert allocate(8, {"a": Demand(3, 8), "b": Demand(1, 8)}) == {"a": 6, "b": 2}


def test_a_run_that_wants_less_leaves_the_rest_to_the_others():
    # b wants 1 of its 4: a takes the other 3 (work-conserving).
    assert allocate(8, {"a": Demand(1, 10), "b": Demand(1, 1)}) == {"a": 7, "b": 1}
    # between SYNC groups a run wants nothing: all slots go to the others
    assert allocate(4, {"a": Demand(1, 10), "b": Demand(1, 0)}) == {"a": 4, "b": 0}


def test_no_run_starves_on_fewer_slots_than_runs():
    caps = allocate(2, {"a": Demand(10, 5), "b": Demand(1, 5), "c": Demand(1, 5)})
    assert caps == {"a": 1, "b": 1, "c": 1}


def test_odd_slots_go_by_remainder_then_run_id_the_same_for_every_trainer():
    runs = {"b": Demand(1, 9), "a": Demand(1, 9)}
    assert allocate(5, runs) == {"a": 3, "b": 2}
    assert allocate(5, dict(reversed(list(runs.items())))) == {"a": 3, "b": 2}


def test_allocation_properties_on_random_farms():
    rng = random.Random(7)
    for _ in range(2000):
        slots = rng.randint(0, 40)
        runs = {f"r{i}": Demand(rng.choice([0.5, 1, 2, 3]), rng.randint(0, 20)) for i in range(rng.randint(1, 6))}
        caps = allocate(slots, runs)
        wanting = [r for r, d in runs.items() if d.tasks > 0]
        assert sum(caps.values()) <= max(slots, len(wanting))
        for run, d in runs.items():
            assert 0 <= caps[run] <= d.tasks
            if d.tasks:
                assert caps[run] >= 1  # nobody starves
        if sum(caps.values()) < slots:  # work-conserving: slots left over only when every demand is met
            assert all(caps[r] == d.tasks for r, d in runs.items())
        # weighted fair up to one slot: of two runs short of their demand, neither holds more than
        # its weight's worth of the other's slots, give or take one (the one-slot floor aside)
        short = [r for r in wanting if caps[r] < runs[r].tasks]
        for a in short:
            for b in short:
                if caps[a] > 1:
                    assert (caps[a] - 1) / runs[a].weight <= (caps[b] + 1) / runs[b].weight + 1e-9, (slots, runs, caps)


def test_a_run_short_of_its_slot_time_gets_more_slots_while_it_wants_them():
    # 1:1, but the SYNC run got a third of the slot time lately (it learns between its groups):
    # while it wants slots it gets more than half of them, until the time evens out.
    even = allocate(4, {"sync": Demand(1, 8, used=0.5), "async": Demand(1, 8, used=0.5)})
    assert even == {"sync": 2, "async": 2}
    short = allocate(4, {"sync": Demand(1, 8, used=0.3), "async": Demand(1, 8, used=0.6)})
    assert short["sync"] > 2 and sum(short.values()) == 4
    # 3:1 with the heavy run at half the time: it may take every slot; the light run, ahead of its
    # part, is held to none for now (it is not owed a slot).
    assert allocate(4, {"big": Demand(3, 8, used=0.45), "small": Demand(1, 8, used=0.45)}) == {"big": 4, "small": 0}


def test_a_run_owed_time_or_new_always_gets_a_slot():
    caps = allocate(4, {"a": Demand(1, 8, used=0.9), "b": Demand(1, 8, used=0.01), "new": Demand(1, 8)})
    assert caps["b"] >= 1 and caps["new"] >= 1 and sum(caps.values()) <= 4
    # a run that wants nothing now is left out of the comparison: the other gets everything it wants
    assert allocate(4, {"a": Demand(1, 8, used=0.9), "idle": Demand(1, 0, used=0.0)}) == {"a": 4, "idle": 0}


def test_compensated_allocation_properties_on_random_farms():
    rng = random.Random(11)
    for _ in range(2000):
        slots = rng.randint(0, 40)
        runs = {
            f"r{i}": Demand(rng.choice([0.5, 1, 3]), rng.randint(0, 20), rng.choice([None, 0.0, rng.random()]))
            for i in range(rng.randint(1, 6))
        }
        caps = allocate(slots, runs)
        assert sum(caps.values()) <= max(slots, sum(1 for d in runs.values() if d.tasks))
        assert all(0 <= caps[r] <= d.tasks for r, d in runs.items())
        if sum(caps.values()) < slots:  # still work-conserving
            assert all(caps[r] == d.tasks for r, d in runs.items())


def test_used_fraction():
    assert used_fraction(30.0, 4, 15.0) == 0.5
    assert used_fraction(1.0, 0, 10.0) == 0.0


# ---- the mechanism, with real processes -------------------------------------------------------
SLEEPY_ENV = {**WORKER_ENV, "RLFARM_ALLOWED_ENV_MODULES": "tests.tiny_envs,benchmarks.slow_envs"}


def _trainer(redis_url: str, tmp_path, run_id: str, *args: str) -> tuple[subprocess.Popen, object]:
    log = tmp_path / f"{run_id}.log"
    proc = start_command(
        "train",
        "--redis",
        redis_url,
        "--run-id",
        run_id,
        "--logdir",
        str(tmp_path),
        "--env",
        "benchmarks.slow_envs:cartpole_sleep_4ms",
        "--total-steps",
        "10000000",
        "--set",
        "farm.steps_per_env=64",
        "--set",
        "env.num_envs=1",
        "--set",
        "eval.interval=0",
        *args,
        env={**os.environ, **SLEEPY_ENV},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


@pytest.mark.fault
def test_shares_follow_the_weights_and_a_killed_trainer_frees_its_share(tmp_path):
    from rlfarm.farm import keys
    from rlfarm.farm.connection import connect
    from rlfarm.farm.shares import RUN_SECONDS, live_slots, read_runs, server_time
    from rlfarm.local.cluster import LocalCluster

    (tmp_path / "farm").mkdir()
    with LocalCluster(workers=4, name="rlfarm-test-shares", log_dir=tmp_path / "farm", extra_env=SLEEPY_ENV) as cluster:
        client = connect(cluster.redis_url)
        poll(lambda: live_slots(client) == 4, "the worker registers its 4 pool processes as slots")
        big, big_log = _trainer(
            cluster.redis_url, tmp_path, "big", "--mode", "async", "--share", "3", "--set", "async.tasks_in_flight=8"
        )
        small, small_log = _trainer(
            cluster.redis_url, tmp_path, "small", "--mode", "sync", "--share", "1", "--set", "farm.num_tasks=8"
        )
        try:

            def caps():
                runs = read_runs(client)
                if {"big", "small"} <= set(runs) and runs["small"]["demand"] != "0":
                    return {r: s["cap"] for r, s in runs.items()}
                return None

            def split():  # both capped, the heavier run holding more of the 4 slots
                c = caps()
                if c and c["big"] and c["small"] and int(c["big"]) > int(c["small"]):
                    return {r: int(v) for r, v in c.items()}
                return None

            poll(split, "both runs registered and capped, weight 3 above weight 1", proc=big, log=big_log)

            def used():  # the slot time each got over the last minute: weight 3 gets more of it
                runs = read_runs(client)
                return (
                    runs.get("big", {}).get("used")
                    and runs.get("small", {}).get("used")
                    and float(runs["big"]["used"]) > float(runs["small"]["used"]) > 0
                )

            poll(used, "the weight-3 run using more of the farm's slot time", proc=big, log=big_log)
            # `rlfarm status` lists both with their weight, cap and the slot time they used.
            status = run_cli("status", "--redis", cluster.redis_url, "--json")
            assert status.returncode == 0, status.stderr
            listed = {r["run_id"]: r["share"] for r in json.loads(status.stdout)["runs"]}
            assert listed["big"]["weight"] == 3.0 and listed["small"]["weight"] == 1.0
            assert listed["big"]["slots"] == listed["small"]["slots"] == 4
            assert 0.0 < listed["big"]["used"] <= 1.0
            table = run_cli("status", "--redis", cluster.redis_url, env={"COLUMNS": "200"})
            assert re.search(r"weight 3, (cap \d of 4|no cap)", table.stdout), table.stdout
            assert re.search(r"weight 1, (cap \d of 4|no cap)", table.stdout), table.stdout
            # SIGKILL the SYNC trainer: nothing of it says goodbye; its registration lapses by itself.
            small.send_signal(signal.SIGKILL)
            small.wait()
            # Its last registration (one transaction): it lapses RUN_SECONDS after it was written.
            last = float(client.hget(keys.share("small"), "updated"))
            lapse = client.zscore(keys.RUNS, "small")
            assert lapse is not None and lapse - last <= RUN_SECONDS + 1e-3
            poll(lambda: "small" not in read_runs(client), "the killed run leaves the registry", proc=big, log=big_log)
            assert server_time(client) >= lapse - 1e-3  # ... when its registration lapsed, not before
            # Alone now: no cap, and the ASYNC run fills every slot it asks for.
            poll(lambda: read_runs(client).get("big", {}).get("cap") == "", "big run uncapped", proc=big, log=big_log)
            poll(
                lambda: int(client.hget(keys.status("big"), "tasks_in_flight") or 0) > 3,
                "the big run takes more than its old cap",
                proc=big,
                log=big_log,
            )
        finally:
            for proc in (big, small):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=60)
        # A trainer that ends (here on SIGTERM) leaves the split at once, not by expiry.
        assert client.zscore(keys.RUNS, "big") is None
        assert not client.exists(keys.share("big"))


def _digest(run_dir) -> str:
    state, _ = codec.decode_policy((run_dir / "final_policy.safetensors").read_bytes())
    return hashlib.sha256(b"".join(state[k].numpy().tobytes() for k in sorted(state))).hexdigest()


def test_a_sync_group_larger_than_its_share_goes_in_waves_and_learns_the_same(farm, tmp_path):
    """Alone, a group of 6 is sent at once; beside a run that wants every slot, at most its share (1
    of the farm's 2 slots) at a time. The tasks and their order in the group are the same, so is
    the policy."""
    from rlfarm.farm.connection import connect
    from rlfarm.farm.shares import FarmShare, live_slots

    client = connect(farm.redis_url)
    poll(lambda: live_slots(client) >= 2, "the farm's worker registers its slots")
    common = [
        "--redis",
        farm.redis_url,
        "--logdir",
        str(tmp_path),
        "--seed",
        "5",
        "--total-steps",
        "6144",
        "--set",
        "farm.num_tasks=6",
        "--set",
        "farm.steps_per_env=256",
        "--set",
        "env.num_envs=2",
        "--set",
        "eval.interval=0",
    ]
    alone = run_cli("train", "--run-id", "waves-alone", *common)
    assert alone.returncode == 0, alone.stderr[-3000:]
    hog = FarmShare(farm.redis_url, "waves-hog", 1.0, "async", demand=lambda: 50, busy=lambda: 0.0).start()
    try:
        shared = run_cli("train", "--run-id", "waves-shared", *common)
    finally:
        hog.stop()
    assert shared.returncode == 0, shared.stderr[-3000:]
    summaries = [json.loads((tmp_path / r / "summary.json").read_text()) for r in ("waves-alone", "waves-shared")]
    assert summaries[0]["tasks_held"] == 0
    assert summaries[1]["tasks_held"] >= 2 * 5  # 2 iterations of 6: 5 of each held at first
    assert _digest(tmp_path / "waves-alone") == _digest(tmp_path / "waves-shared")


def test_finished_tasks_waiting_for_the_learner_take_no_slot():
    """A learner behind its farm leaves finished tasks' results in Redis: they count as pending for
    liveness but not as slots held, so its share does not keep other runs (or itself) off idle slots."""
    from celery import Celery

    from rlfarm.core.protocol import TaskSpec
    from rlfarm.trainer.channel import FarmLink, ShareTerms

    # The share's client is never used here: its registry is not refreshed, nothing connects.
    d = FarmLink(Celery(), None, "r", 60.0, 3, share=ShareTerms("redis://127.0.0.1:1", 1.0, "async")).open()
    d.share.results_waiting = 2  # what FarmShare's last refresh read: the run's results list length
    for i in range(3):
        spec = TaskSpec("r", "rollout", i, 0, 0, 1, steps=8)
        d.pending.open(spec, f"id{i}", 0.0)
    d.held.append(TaskSpec("r", "rollout", 9, 0, 0, 1, steps=8))
    assert d.in_flight == 3 and d.outstanding() == 4
    assert d.on_farm() == 1 and d.wants_slots() == 2
    d.share.results_waiting = 5  # more results than pending (an evaluation's, a duplicate's)
    assert d.on_farm() == 0

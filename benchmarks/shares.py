"""Fair shares between runs on one farm: the fraction of the farm's slot time each run's tasks get.

One Redis and one rlfarm worker with `--slots` pool processes (the embedded cluster's), an env that
sleeps 4 ms a step (benchmarks.slow_envs:cartpole_sleep_4ms), so the CPU does not decide who gets
what; trainers are `rlfarm train --redis URL --share W` processes. Each run's trainer registers the
worker seconds its finished tasks ran (rlfarm.farm.shares: `busy`), read here at the start and end
of a window:

  1. weights 1:1, a SYNC run (groups of 8) beside an ASYNC run (8 tasks in flight): 0.5 each;
  2. weights 3:1, the same two runs: 0.75 and 0.25;
  3. a third run (weight 1) joins runs 1:1: how many seconds until it has its third.

Fractions are of the slot time used by the runs (their sum is the farm's busy time), and of all the
farm's slot time (what idled between a result and the next task is in neither run's).

    python benchmarks/shares.py [--slots 4] [--seconds 45] [--warmup 15]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfarm.farm.connection import connect  # noqa: E402
from rlfarm.farm.shares import live_slots, read_runs  # noqa: E402
from rlfarm.local.cluster import LocalCluster  # noqa: E402

ENV = "benchmarks.slow_envs:cartpole_sleep_4ms"
CHILD_ENV = {"PYTHONPATH": str(ROOT), "RLFARM_ALLOWED_ENV_MODULES": "benchmarks.slow_envs"}


def trainer(url: str, logdir: Path, run_id: str, mode: str, share: float) -> subprocess.Popen:
    sized = ["--set", "farm.num_tasks=8"] if mode == "sync" else ["--set", "async.tasks_in_flight=8"]
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "cli.py"),
            "train",
            "--redis",
            url,
            "--run-id",
            run_id,
            "--logdir",
            str(logdir),
            "--env",
            ENV,
            "--mode",
            mode,
            "--share",
            str(share),
            "--total-steps",
            "100000000",
            "--set",
            "farm.steps_per_env=64",
            "--set",
            "env.num_envs=1",
            "--set",
            "eval.interval=0",
            *sized,
        ],
        stdout=(logdir / f"{run_id}.log").open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **CHILD_ENV},
        start_new_session=True,
    )


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def busy(client, runs: list[str]) -> dict[str, float]:
    found = read_runs(client)
    return {r: float(found.get(r, {}).get("busy", "nan")) for r in runs}


def wait_registered(client, runs: list[str], procs: list[subprocess.Popen]) -> None:
    while not set(runs) <= {r for r, s in read_runs(client).items() if float(s.get("busy", 0)) > 0}:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a trainer exited before its run started; see its log")
        time.sleep(0.2)


def window(client, runs: list[str], slots: int, seconds: float) -> dict[str, tuple[float, float]]:
    """(fraction of the runs' busy time, fraction of the farm's slot time) per run, over `seconds`."""
    t0, b0 = time.monotonic(), busy(client, runs)
    time.sleep(seconds)  # the measurement window itself
    t1, b1 = time.monotonic(), busy(client, runs)
    used = {r: b1[r] - b0[r] for r in runs}
    total = sum(used.values())
    return {r: (used[r] / total, used[r] / (slots * (t1 - t0))) for r in runs}


def pair(client, url: str, logdir: Path, weights: tuple[float, float], slots: int, args) -> dict:
    tag = f"{weights[0]:g}to{weights[1]:g}"
    runs = [f"sync-{tag}", f"async-{tag}"]
    procs = [trainer(url, logdir, runs[0], "sync", weights[0]), trainer(url, logdir, runs[1], "async", weights[1])]
    try:
        wait_registered(client, runs, procs)
        time.sleep(args.warmup)  # past start-up: both trainers publishing and sending
        return window(client, runs, slots, args.seconds)
    finally:
        stop(procs)


def joining(client, url: str, logdir: Path, slots: int, args) -> float:
    """Seconds from the third run's first finished task until the 5 s before gave it >= 0.8 of its
    1/3 share of the slots (5 s of it are the window itself)."""
    runs = ["join-a", "join-b"]
    procs = [trainer(url, logdir, runs[0], "sync", 1), trainer(url, logdir, runs[1], "async", 1)]
    try:
        wait_registered(client, runs, procs)
        time.sleep(args.warmup)
        procs.append(trainer(url, logdir, "join-c", "async", 1))
        wait_registered(client, ["join-c"], procs)
        start = time.monotonic()
        samples = [(start, busy(client, ["join-c"])["join-c"])]
        while time.monotonic() - start < args.seconds:
            time.sleep(0.5)  # sampling interval
            now = time.monotonic()
            samples.append((now, busy(client, ["join-c"])["join-c"]))
            old = [s for s in samples if s[0] <= now - 5.0]
            if old:
                t0, b0 = old[-1]
                if (samples[-1][1] - b0) / (slots * (now - t0)) >= 0.8 / 3:
                    return now - start
        return float("nan")
    finally:
        stop(procs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, default=4, help="worker pool processes")
    parser.add_argument("--seconds", type=float, default=45.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=15.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        with LocalCluster(
            workers=args.slots, name="rlfarm-bench-shares", log_dir=logdir, extra_env=CHILD_ENV
        ) as cluster:
            client = connect(cluster.redis_url)
            while live_slots(client) < args.slots:
                time.sleep(0.2)
            print(
                f"farm: 1 worker, {args.slots} slots; env {ENV}; window {args.seconds:g} s after "
                f"{args.warmup:g} s warm-up"
            )
            for weights in ((1.0, 1.0), (3.0, 1.0)):
                result = pair(client, cluster.redis_url, logdir, weights, args.slots, args)
                (s_used, s_all), (a_used, a_all) = result.values()
                want = weights[0] / sum(weights)
                print(
                    f"weights {weights[0]:g}:{weights[1]:g}  SYNC (groups of 8) {s_used:.3f} of the runs' "
                    f"slot time ({s_all:.3f} of all), ASYNC (8 in flight) {a_used:.3f} ({a_all:.3f}); "
                    f"SYNC's due share {want:.2f}, off by {abs(s_used - want):.3f}"
                )
            seconds = joining(client, cluster.redis_url, logdir, args.slots, args)
            print(
                f"a third run (weight 1) joining two: {seconds:.1f} s from its first finished task until "
                f"the 5 s before gave it >= 0.8 of its 1/3 share"
            )


if __name__ == "__main__":
    main()

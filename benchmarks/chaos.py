"""Throughput under faults: the same ASYNC run fault-free and under chaos, in one invocation.

    python benchmarks/chaos.py --steps 90000

Each run gets its own redis-server (append-only file, fsync always) and two workers, one
`rlfarm worker` and one `celery -A tasks worker`, one pool process each, on 127.0.0.1. The run is
ASYNC DQN on `tests.tiny_envs:slow` (a CartPole-shaped env that busy-waits 2 ms per step, 1 env x
250 steps per task), 0.1 gradient steps per env step. Under chaos a random pool process is SIGKILLed
every 10 s and the redis-server is restarted once (SIGTERM, 2 s down, restarted from its
append-only file) 45 s in. Prints env steps/s of both runs, their ratio, and the fault counters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfarm.farm.app import make_app  # noqa: E402
from rlfarm.local.cluster import LocalCluster, RedisSpec  # noqa: E402

ENV = {
    "PYTHONPATH": str(ROOT),
    "RLFARM_ALLOWED_ENV_MODULES": "tests.tiny_envs",
    "RLFARM_REDIS_OUTAGE_TIMEOUT": "300",
}  # workers wait out the restart, as on a real farm
ARGS = [
    "--preset",
    "cartpole-dqn",
    "--mode",
    "async",
    "--env",
    "tests.tiny_envs:slow",
    "--set",
    "env.num_envs=1",
    "--set",
    "farm.steps_per_env=250",
    "--set",
    "policy.hidden_sizes=[16]",
    "--set",
    "dqn.learning_starts=256",
    "--set",
    "dqn.replay_ratio=0.1",
    "--set",
    "eval.interval=0",
    "--set",
    "target_return=inf",
    "--set",
    "farm.lease_seconds=3",
]


def pool_pids(url: str) -> list[int]:
    app = make_app(url)
    try:
        stats = app.control.inspect(timeout=2.0).stats() or {}
    finally:
        app.close()
    return sorted(pid for s in stats.values() for pid in s["pool"]["processes"])


def run(steps: int, chaos: bool, seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(
            workers=0,
            name=f"rlfarm-chaos-{os.getpid()}",
            log_dir=Path(tmp),
            extra_env=ENV,
            redis=RedisSpec(
                args=(
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                )
            ),
        )
        cluster.start()
        try:
            cluster.add_worker(1, command=[sys.executable, str(ROOT / "cli.py"), "worker", "-l", "WARNING"])
            cluster.add_worker(1)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "cli.py"),
                    "train",
                    "--redis",
                    cluster.redis_url,
                    "--run-id",
                    "chaos",
                    "--logdir",
                    tmp,
                    "--total-steps",
                    str(steps),
                    *ARGS,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, **ENV},
            )
            kills, rng, started, restarted = 0, random.Random(seed), time.monotonic(), False
            while chaos and proc.poll() is None:
                time.sleep(10)
                if not restarted and time.monotonic() - started > 45:
                    cluster.stop_redis(signal.SIGTERM)
                    time.sleep(2)
                    cluster.start_redis(same_port=True)
                    restarted = True
                    continue
                try:
                    os.kill(rng.choice(pool_pids(cluster.redis_url)), signal.SIGKILL)
                    kills += 1
                except Exception:  # noqa: BLE001 - no answer this round; the next one
                    pass
            _, stderr = proc.communicate()
            if proc.returncode != 0:
                raise SystemExit(f"run failed:\n{stderr[-3000:]}")
            summary = json.loads((Path(tmp) / "chaos" / "summary.json").read_text())
            summary["kills"] = kills
            return summary
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=90_000)
    args = parser.parse_args()
    clean = run(args.steps, chaos=False)
    chaos = run(args.steps, chaos=True)
    print(f"cores: {os.cpu_count()}, env steps per run: {args.steps}")
    print(
        f"{'run':<12} {'SPS':>8} {'wall s':>8} {'kills':>6} {'redispatched':>13} {'duplicates':>11} "
        f"{'unique ids == accepted':>23}"
    )
    for name, s in (("fault-free", clean), ("chaos", chaos)):
        ids = s["accepted_task_ids"]
        print(
            f"{name:<12} {s['env_steps'] / s['wall_seconds']:>8.0f} {s['wall_seconds']:>8.1f} {s['kills']:>6} "
            f"{s['redispatched']:>13} {s['duplicates']:>11} {str(len(ids) == len(set(ids))):>23}"
        )
    print(f"chaos faults: {chaos['faults']}")
    ratio = (chaos["env_steps"] / chaos["wall_seconds"]) / (clean["env_steps"] / clean["wall_seconds"])
    print(f"throughput under chaos / fault-free: {ratio:.2f}")


if __name__ == "__main__":
    main()

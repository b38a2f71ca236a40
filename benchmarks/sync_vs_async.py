"""Env steps per second in SYNC and ASYNC mode with the same workers, and ASYNC policy lag.

    python benchmarks/sync_vs_async.py --workers 2 --steps 50000

Runs on the embedded default, one run after another:
  sync  PPO    preset cartpole-ppo (learner idle while workers collect, and the reverse)
  async DQN    preset cartpole-dqn (collection overlaps learning; SPS bounded by the replay ratio)
  async DQN    same, replay_ratio 0: collection only, what the farm delivers in ASYNC mode
and prints SPS (consumed env steps / training wall time) and the distribution of policy lag
(trainer version - acting version, in versions) over every result consumed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(workers: int, steps: int, *args: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "train",
                "--workers",
                str(workers),
                "--total-steps",
                str(steps),
                "--logdir",
                tmp,
                "--run-id",
                "bench",
                "--set",
                "target_return=inf",
                *args,
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        return json.loads((Path(tmp) / "bench" / "summary.json").read_text())


def percentile(hist: dict[str, int], q: float) -> int:
    total = sum(hist.values())
    seen = 0
    for lag, count in sorted((int(k), v) for k, v in hist.items()):
        seen += count
        if seen >= q * total:
            return lag
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50_000)
    args = parser.parse_args()
    cases = [
        ("sync PPO (cartpole-ppo)", ["--preset", "cartpole-ppo"]),
        ("async DQN (cartpole-dqn)", ["--preset", "cartpole-dqn", "--set", "eval.interval=0"]),
        (
            "async DQN, replay_ratio 0",
            ["--preset", "cartpole-dqn", "--set", "eval.interval=0", "--set", "dqn.replay_ratio=0"],
        ),
    ]
    print(f"cores: {os.cpu_count()}, worker processes: {args.workers}, env steps per run: {args.steps}")
    print(f"{'mode':<28} {'SPS':>8} {'lag p50':>8} {'p90':>5} {'max':>5} {'dropped':>8}")
    for name, extra in cases:
        s = run(args.workers, args.steps, *extra)
        sps = s["env_steps"] / s["wall_seconds"]
        hist = s.get("policy_lag_histogram")
        if hist:
            lags = f"{percentile(hist, 0.5):>8} {percentile(hist, 0.9):>5} {max(map(int, hist)):>5}"
        else:
            lags = f"{'0':>8} {'0':>5} {'0':>5}"
        print(f"{name:<28} {sps:>8.0f} {lags} {s['dropped_stale']:>8}", flush=True)
    print("SYNC acts with the current version by construction (lag 0).")


if __name__ == "__main__":
    main()

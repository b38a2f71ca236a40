"""ASYNC PPO (APPO, V-trace) against SYNC PPO and Stable-Baselines3 PPO on CartPole-v1, in one run;
then an ablation at high policy lag: V-trace on against off.

    pip install -e ".[bench]"
    python benchmarks/appo.py --seeds 1 2 3 4 5

Solved: the mean return of the last 20 training episodes reaches 475 (as in vs_sb3.py); times from
the start of learning. rlfarm runs on the embedded default with 2 worker processes: SYNC is preset
cartpole-ppo, ASYNC cartpole-appo (2 tasks in flight, one result per update). The ablation runs
cartpole-appo with 8 tasks in flight and a version per result (lag of several versions, tasks act
with the version they started with) with ppo.vtrace true and false, and reports how many seeds solve
and the best rolling return. The third table (`--farm-seeds`) stands in for a farm whose workers have
cores of their own: CartPole sleeping 0.25 ms a step (benchmarks/slow_envs.py), so collection costs
wall time but no CPU and the learner can overlap it, as on separate machines; ASYNC with and without
`async.refresh_steps` (tasks switching to newer versions while they run) against SYNC.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_sb3 import ROOT, THRESHOLD, WINDOW, rlfarm_time_to_solve, rolling_solve, sb3_time_to_solve  # noqa: E402

HIGH_LAG = (
    "--set",
    "async.tasks_in_flight=8",
    "--set",
    "async.results_per_update=1",
    "--set",
    "async.refresh_steps=0",
    "--total-steps",
    "102400",
)
SLEEPY = ("--env", "benchmarks.slow_envs:cartpole_sleepy")  # a step costs 0.25 ms of wall time, no CPU


def median(xs: list[float]) -> float:
    return statistics.median(math.inf if math.isnan(x) else x for x in xs)  # unsolved: infinitely slow


def ablation_run(seed: int, vtrace: bool) -> tuple[float, int, float, int]:
    """(seconds to solve or nan, env steps to solve or -1, best rolling return, max policy lag)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "cli.py"),
                "train",
                "--preset",
                "cartpole-appo",
                "--seed",
                str(seed),
                "--logdir",
                tmp,
                "--run-id",
                "lag",
                *HIGH_LAG,
                "--set",
                f"ppo.vtrace={'true' if vtrace else 'false'}",
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        seconds, steps, best = rolling_solve(Path(tmp) / "lag" / "episodes.csv")
        with open(Path(tmp) / "lag" / "progress.csv") as f:
            lag = max(int(r["farm/policy_lag_max"]) for r in csv.DictReader(f))
        return seconds, steps, best, lag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--ablation-seeds",
        type=int,
        nargs="*",
        default=[1, 2, 3, 4, 5],
        help="seeds of the high-lag ablation (none: skip it)",
    )
    parser.add_argument(
        "--farm-seeds", type=int, nargs="*", default=[1, 2, 3], help="seeds of the sleep-bound table (none: skip it)"
    )
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; solved: mean of the last {WINDOW} training episodes >= {THRESHOLD:g}")
    print(
        f"{'seed':>4} {'ASYNC s':>8} {'steps':>7} {'SYNC s':>7} {'steps':>7} {'SB3 s':>6} {'steps':>7} "
        f"{'ASYNC/SYNC':>10} {'ASYNC/SB3':>9}"
    )
    rows = []
    for seed in args.seeds:
        a = rlfarm_time_to_solve(seed, args.workers, "ppo", preset="cartpole-appo")
        s = rlfarm_time_to_solve(seed, args.workers, "ppo")
        b = sb3_time_to_solve(seed)
        rows.append((a, s, b))
        print(
            f"{seed:>4} {a[0]:>8.1f} {a[1]:>7} {s[0]:>7.1f} {s[1]:>7} {b[0]:>6.1f} {b[1]:>7} "
            f"{a[0] / s[0]:>10.2f} {a[0] / b[0]:>9.2f}",
            flush=True,
        )
    ma, ms, mb = (median([r[i][0] for r in rows]) for i in range(3))
    unsolved = [sum(math.isnan(r[i][0]) for r in rows) for i in range(3)]
    print(
        f"median time to solve: ASYNC {ma:.1f} s, SYNC {ms:.1f} s, SB3 {mb:.1f} s -> ASYNC/SYNC "
        f"{ma / ms:.2f}x, ASYNC/SB3 {ma / mb:.2f}x; unsolved: ASYNC {unsolved[0]}, SYNC {unsolved[1]}, "
        f"SB3 {unsolved[2]} of {len(rows)}"
    )

    if args.ablation_seeds:
        ablation(args.ablation_seeds)
    if args.farm_seeds:
        sleep_bound(args.farm_seeds, args.workers)


def ablation(seeds: list[int]) -> None:
    print(f"\nablation at high lag ({' '.join(HIGH_LAG)}):")
    print(f"{'seed':>4} {'V-trace':>8} {'solved s':>9} {'steps':>7} {'best':>7} {'max lag':>8}")
    results: dict[bool, list] = {True: [], False: []}
    for seed in seeds:
        for vtrace in (True, False):
            r = ablation_run(seed, vtrace)
            results[vtrace].append(r)
            print(f"{seed:>4} {'on' if vtrace else 'off':>8} {r[0]:>9.1f} {r[1]:>7} {r[2]:>7.1f} {r[3]:>8}", flush=True)
    for vtrace in (True, False):
        rs = results[vtrace]
        print(
            f"V-trace {'on' if vtrace else 'off'}: solved {sum(not math.isnan(r[0]) for r in rs)} of {len(rs)}, "
            f"median best rolling return {statistics.median(r[2] for r in rs):.1f}"
        )


def sleep_bound(seeds: list[int], workers: int) -> None:
    print(f"\nsleep-bound CartPole ({' '.join(SLEEPY)}): collection costs wall time, not CPU")
    print(f"{'seed':>4} {'ASYNC s':>8} {'steps':>7} {'no refresh s':>12} {'steps':>7} {'SYNC s':>7} {'steps':>7}")
    rows = []
    for seed in seeds:
        a = rlfarm_time_to_solve(seed, workers, "ppo", preset="cartpole-appo", extra=SLEEPY)
        n = rlfarm_time_to_solve(
            seed, workers, "ppo", preset="cartpole-appo", extra=(*SLEEPY, "--set", "async.refresh_steps=0")
        )
        s = rlfarm_time_to_solve(seed, workers, "ppo", extra=SLEEPY)
        rows.append((a, n, s))
        print(f"{seed:>4} {a[0]:>8.1f} {a[1]:>7} {n[0]:>12.1f} {n[1]:>7} {s[0]:>7.1f} {s[1]:>7}", flush=True)
    ma, mn, ms = (median([r[i][0] for r in rows]) for i in range(3))
    print(
        f"median time to solve: ASYNC {ma:.1f} s, ASYNC without refresh {mn:.1f} s, SYNC {ms:.1f} s -> "
        f"ASYNC/SYNC {ma / ms:.2f}x, without refresh {mn / ms:.2f}x"
    )


if __name__ == "__main__":
    main()

"""Recurrent APPO (issue 53): an LSTM policy learned on the ASYNC farm with V-trace over sequences,
against the same network learned SYNC, and at high policy lag with and without R2D2's burn-in.

    python benchmarks/recurrent_appo.py --seeds 1 2 3 4 5

Every arm trains on rlfarm/cartpole_no_vel (CartPole with its velocities masked: only a memory balances
it) on the embedded default with `--workers` processes, until the mean return of the last 20 training
episodes reaches 475 or the 100k budget ends, and its final policy is scored by `rlfarm eval` (20
greedy episodes on fresh seeds). Arms:
- sync: preset cartpole-no-vel-lstm (each iteration waits for its 2 tasks, acted by one version);
- async: preset cartpole-no-vel-lstm-appo (results learned as they come, V-trace over sequences);
- the high-lag arms: 8 tasks in flight, 2 results an update, so results arrive several versions old and
  the state each sequence starts from was recorded by an older network: burn-in 0 or `--burn-in`
  steps (policy.burn_in), the sequence a whole task (32 steps) or `--seq-len`; and V-trace off.
Results are a JSON file beside the printed table (`--out`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIGH_LAG = ("--set", "async.tasks_in_flight=8", "--set", "async.results_per_update=2")


def arms(burn_in: int, seq_len: int) -> dict[str, tuple[str, ...]]:
    appo = ("--preset", "cartpole-no-vel-lstm-appo")
    short = ("--set", f"policy.seq_len={seq_len}")
    quarter = f"policy.burn_in={burn_in // 4}"
    return {
        "sync": ("--preset", "cartpole-no-vel-lstm"),
        "async": appo,
        "lag": (*appo, *HIGH_LAG),
        f"lag burn-in {burn_in}": (*appo, *HIGH_LAG, "--set", f"policy.burn_in={burn_in}"),
        f"lag seq {seq_len}": (*appo, *HIGH_LAG, *short),
        f"lag seq {seq_len} burn-in {burn_in // 4}": (*appo, *HIGH_LAG, *short, "--set", quarter),
        "lag, V-trace off": (*appo, *HIGH_LAG, "--set", "ppo.vtrace=false"),
    }


def run(args: tuple[str, ...], seed: int, workers: int) -> dict:
    """One run: env steps and seconds to 475 (None: not reached), best rolling mean, policy lag, greedy score."""
    cli = [sys.executable, str(ROOT / "cli.py")]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [*cli, "train", *args, "--seed", str(seed), "--workers", str(workers), "--logdir", tmp, "--run-id", "r"],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        summary = json.loads((Path(tmp) / "r" / "summary.json").read_text())
        home = subprocess.run(
            [*cli, "eval", "--policy", str(Path(tmp) / "r" / "final_policy.safetensors"), "--episodes", "20"]
            + ["--seed", "777"],
            check=True,
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
    at = summary.get("target_reached_at") or {}
    lags = [int(k) for k in summary.get("policy_lag_histogram") or {"0": 0}]
    return {
        "seed": seed,
        "steps_to_475": at.get("env_steps"),
        "seconds_to_475": at.get("wall_seconds"),
        "best_rolling": summary["best_rolling_return"],
        "max_policy_lag": max(lags),
        "greedy": float(home.stdout.split("mean return ")[1].split()[0]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--burn-in", type=int, default=8, help="burn-in steps of a whole-task sequence (32 steps)")
    parser.add_argument("--seq-len", type=int, default=16, help="the shorter sequence (burn-in a quarter of --burn-in)")
    parser.add_argument("--arms", nargs="*", help="only these arms (names as printed)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "recurrent-appo")
    args = parser.parse_args()
    chosen = {k: v for k, v in arms(args.burn_in, args.seq_len).items() if not args.arms or k in args.arms}
    print(f"cores: {os.cpu_count()}, workers: {args.workers}; rlfarm/cartpole_no_vel, 475 within 100k env steps")
    print(f"{'arm':<24} {'solved':>6} {'median steps':>12} {'median s':>8} {'max lag':>7} {'greedy (median)':>15}")
    results = {}
    for name, extra in chosen.items():
        runs = [run(extra, seed, args.workers) for seed in args.seeds]
        results[name] = {"args": list(extra), "runs": runs}
        solved = [r for r in runs if r["steps_to_475"] is not None]
        steps = statistics.median(r["steps_to_475"] for r in solved) if solved else float("nan")
        seconds = statistics.median(r["seconds_to_475"] for r in solved) if solved else float("nan")
        print(
            f"{name:<24} {len(solved):>3}/{len(runs):<2} {steps:>12.0f} {seconds:>8.1f} "
            f"{max(r['max_policy_lag'] for r in runs):>7} {statistics.median(r['greedy'] for r in runs):>15.1f}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cartpole.json"
    meta = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "workers": args.workers}
    path.write_text(json.dumps({"meta": meta, "seeds": args.seeds, "arms": results}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()

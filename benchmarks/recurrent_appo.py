"""Recurrent APPO (issue 53): an LSTM policy learned on the ASYNC farm with V-trace over sequences,
against the same network learned SYNC, and at high policy lag with and without R2D2's burn-in.

    python benchmarks/recurrent_appo.py --seeds 1 2 3 4 5

Every arm trains on rlfarm/cartpole_no_vel (CartPole with its velocities masked: only a memory balances
it) on the embedded default with `--workers` processes, until a greedy evaluation (every 8,192 env
steps, 10 episodes) reaches 475 and 20 more greedy episodes confirm it, or the 100k budget ends; the
best policy is scored by `rlfarm eval` (20 greedy episodes on fresh seeds). Arms:
- sync: preset cartpole-no-vel-lstm (each iteration waits for its 2 tasks, acted by one version);
- async (preset): cartpole-no-vel-lstm-appo, 8 tasks in flight, 2 results an update, so results
  arrive up to 8 versions old and the state each sequence starts from was recorded by an older
  network; and with 2 tasks in flight (a lag of 1);
- burn-in: R2D2's (policy.burn_in) on the whole-task sequence (32 steps), and on sequences of
  `--seq-len` steps with a quarter of it; V-trace off (the lagged results taken as on-policy).
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
LOW_LAG = ("--set", "async.tasks_in_flight=2")
GREEDY_TARGET = ("--set", "eval.interval=8192")  # the SYNC preset judged as the ASYNC one is


def arms(burn_in: int, seq_len: int) -> dict[str, tuple[str, ...]]:
    appo = ("--preset", "cartpole-no-vel-lstm-appo", "--total-steps", "100352")  # the SYNC preset's budget
    short = ("--set", f"policy.seq_len={seq_len}")
    quarter = f"policy.burn_in={burn_in // 4}"
    return {
        "sync": ("--preset", "cartpole-no-vel-lstm", *GREEDY_TARGET),
        "async (preset)": appo,
        "async, 2 in flight": (*appo, *LOW_LAG),
        f"burn-in {burn_in}": (*appo, "--set", f"policy.burn_in={burn_in}"),
        f"seq {seq_len}": (*appo, *short),
        f"seq {seq_len} burn-in {burn_in // 4}": (*appo, *short, "--set", quarter),
        "V-trace off": (*appo, "--set", "ppo.vtrace=false"),
    }


def run(args: tuple[str, ...], seed: int, workers: int) -> dict:
    """One run: env steps and seconds to 475 (None: not reached), best rolling mean, policy lag, greedy score."""
    cli = [sys.executable, str(ROOT / "cli.py")]
    with tempfile.TemporaryDirectory() as tmp:
        trained = subprocess.run(
            [*cli, "train", *args, "--seed", str(seed), "--workers", str(workers), "--logdir", tmp, "--run-id", "r"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if trained.returncode:
            raise SystemExit(f"rlfarm train {' '.join(args)} --seed {seed} failed:\n{trained.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "r" / "summary.json").read_text())
        home = subprocess.run(
            [*cli, "eval", "--policy", str(Path(tmp) / "r" / "best_policy.safetensors"), "--episodes", "20"]
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
        "best_eval": summary["best_eval_mean_return"],
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
    print(
        f"cores: {os.cpu_count()}, workers: {args.workers}; rlfarm/cartpole_no_vel, "
        "a confirmed greedy 475 within 100k env steps"
    )
    print(f"{'arm':<24} {'solved':>6} {'median steps':>12} {'median s':>8} {'max lag':>7} {'home (median)':>13}")
    results = {}
    for name, extra in chosen.items():
        runs = [run(extra, seed, args.workers) for seed in args.seeds]
        results[name] = {"args": list(extra), "runs": runs}
        solved = [r for r in runs if r["steps_to_475"] is not None]
        steps = statistics.median(r["steps_to_475"] for r in solved) if solved else float("nan")
        seconds = statistics.median(r["seconds_to_475"] for r in solved) if solved else float("nan")
        print(
            f"{name:<24} {len(solved):>3}/{len(runs):<2} {steps:>12.0f} {seconds:>8.1f} "
            f"{max(r['max_policy_lag'] for r in runs):>7} {statistics.median(r['greedy'] for r in runs):>13.1f}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cartpole.json"
    meta = {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(), "workers": args.workers}
    path.write_text(json.dumps({"meta": meta, "seeds": args.seeds, "arms": results}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()

"""A sweep's best preset against the shipped one: `rlfarm sweep` on cartpole-ppo, then both presets
trained with `--seeds` to a greedy evaluation of 475 confirmed on 20 more episodes, in one run.

1. `rlfarm sweep --preset cartpole-ppo --space benchmarks/spaces/cartpole-ppo.toml --trials 16
   --parallel 2 --total-steps 32768 --metric return` on an embedded farm: each trial scored by the best
   mean of 20 training episodes within 32k env steps (the shipped preset needs 35k-55k for 475, so
   the budget separates the trials);
2. `rlfarm train --preset P --seeds 1-3 --total-steps 102400 --target-return 475 --set
   eval.interval=4096` for the shipped preset and the sweep's best.toml;
3. per seed: env steps and wall seconds to the confirmed 475 (summary.json's target_reached_at).
   The three seeds of a preset train at once on one embedded farm, so wall seconds are of a shared
   farm; env steps do not depend on it.

    python benchmarks/sweep_cartpole.py [--trials 16] [--parallel 2] [--logdir /tmp/sweep-bench]
    python benchmarks/sweep_cartpole.py --best PATH/best.toml   # step 2-3 only
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "benchmarks" / "spaces" / "cartpole-ppo.toml"
SEEDS = "1-3"


def rlfarm(*args: str) -> None:
    print("$ rlfarm " + " ".join(args), flush=True)
    code = subprocess.call([sys.executable, str(ROOT / "cli.py"), *args])
    if code not in (0, 1):  # 1: some seed or trial failed; what finished is still reported
        raise SystemExit(f"rlfarm {args[0]} exited {code}")


def to_target(logdir: Path, preset: str, name: str) -> list[tuple[int, int | None, float | None]]:
    rlfarm(
        "train",
        "--preset",
        preset,
        "--seeds",
        SEEDS,
        "--run-id",
        name,
        "--logdir",
        str(logdir),
        "--total-steps",
        "102400",
        "--target-return",
        "475",
        "--set",
        "eval.interval=4096",
    )
    rows = []
    for seed in range(1, 4):
        try:
            summary = json.loads((logdir / f"{name}-s{seed}" / "summary.json").read_text())
        except OSError:
            rows.append((seed, None, None))
            continue
        reached = summary.get("target_reached_at") or {}
        rows.append((seed, reached.get("env_steps"), reached.get("wall_seconds")))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="the sampler's seed")
    parser.add_argument("--logdir", default="/tmp/sweep-bench")
    parser.add_argument("--best", help="a best.toml already found: skip the sweep")
    args = parser.parse_args()
    logdir = Path(args.logdir)
    best = args.best
    if best is None:
        rlfarm(
            "sweep",
            "--preset",
            "cartpole-ppo",
            "--space",
            str(SPACE),
            "--trials",
            str(args.trials),
            "--parallel",
            str(args.parallel),
            "--total-steps",
            "32768",
            "--metric",
            "return",
            "--seed",
            str(args.seed),
            "--study",
            "cartpole-sweep",
            "--logdir",
            str(logdir),
        )
        best = str(logdir / "cartpole-sweep" / "best.toml")
    print(Path(best).read_text())
    results = {
        "shipped cartpole-ppo": to_target(logdir, "cartpole-ppo", "shipped"),
        "sweep's best.toml": to_target(logdir, best, "best"),
    }
    print("\nenv steps and wall seconds to a greedy evaluation of 475 confirmed on 20 more episodes:")
    for name, rows in results.items():
        cells = "  ".join(f"seed {s}: " + (f"{n:,} steps, {w:.0f} s" if n else "not reached") for s, n, w in rows)
        steps = [n for _, n, _ in rows if n]
        mean = f"mean {statistics.mean(steps):,.0f} steps" if steps else "none reached"
        print(f"{name:22s} {cells}  ({mean}, {len(steps)}/3 reached)")


if __name__ == "__main__":
    main()
